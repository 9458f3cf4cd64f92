"""Tokenizers for CTC targets: phones, characters, sentencepiece pieces.

Every tokenizer reserves id 0 for the CTC blank; real tokens are 1 .. vocab_size - 1. Each one
reads one supervision field: phones read `supervision.custom["phones"]`, characters and
sentencepiece read `supervision.text`. `state_dict()` is plain JSON (the sentencepiece model as
base64), so the token table travels inside a checkpoint and `tokenizer_from_state_dict` rebuilds
exactly the same tokenizer without the training text. For a split of a corpus, `build_tokenizers`
makes them from the training cuts, `check_transcripts` checks every cut's transcripts before
training and `encode_transcripts` turns one cut's into ids when its batch is built.

Decisions:
- phones: a fixed inventory in a fixed order, named by the manifests' `custom["phone_set"]`:
  "arpabet39" (the default when a manifest names none) or "timit61", or any set of asr.text.phones.PHONE_SETS; a phone
  outside it is an error (a recipe must map its phones onto the set first), never silently dropped.
- chars: the normalised alphabet (space, apostrophe, a-z) plus any other character of the training
  text, so a dev/test utterance never fails on a letter that happens to be missing from train.
- sentencepiece: trained on the training text with character coverage 1.0, identity normalisation
  (the text is already normalised) and every letter of the normalised alphabet forced into the
  model; `vocab_size` counts sentencepiece pieces (including <unk>), the tokenizer's vocab_size is
  that plus the blank. A character the model has never seen is an error, not a silent <unk>.
"""

from __future__ import annotations

import base64
import io
import logging
import re
import string
from collections import defaultdict
from typing import Callable, Iterable, Sequence

from lhotse import CutSet

from asr.data.corpus.manifests import ManifestError, listing, transcript
from asr.text.phones import DEFAULT_PHONE_SET, PHONE_SETS, strip_stress

log = logging.getLogger(__name__)

BLANK_ID = 0
BLANK_SYMBOL = "<blank>"
NORMALISED_ALPHABET = " '" + string.ascii_lowercase
TOKENIZER_KINDS = ("phones", "chars", "sentencepiece")
SENTENCEPIECE_TYPES = ("unigram", "bpe")
_STATE_FORMAT = 1


class UnknownTokenError(ValueError):
    """A transcript holds symbols outside a tokenizer's table; `tokens` lists them, `advice` says what to do."""

    def __init__(self, message: str, tokens: list[str], advice: str = ""):
        super().__init__(f"{message}: {advice}" if advice else message)
        self.tokens = tokens
        self.advice = advice


class Tokenizer:
    """Base class: maps a supervision field's string to ids (blank = 0) and back."""

    kind: str = ""
    field: str = ""
    blank_id: int = BLANK_ID

    @property
    def vocab_size(self) -> int:
        """Number of CTC output classes, blank included."""
        raise NotImplementedError

    def encode(self, s: str) -> list[int]:
        raise NotImplementedError

    def decode(self, ids: Iterable[int]) -> str:
        raise NotImplementedError

    def state_dict(self) -> dict:
        raise NotImplementedError

    def _check_ids(self, ids: Iterable[int]) -> list[int]:
        ids = [int(i) for i in ids]
        bad = [i for i in ids if not 0 <= i < self.vocab_size]
        if bad:
            raise ValueError(f"{self.kind} tokenizer: ids {bad[:10]} are outside 0..{self.vocab_size - 1}")
        return [i for i in ids if i != self.blank_id]

    def __repr__(self) -> str:
        return f"{type(self).__name__}(kind={self.kind!r}, field={self.field!r}, vocab_size={self.vocab_size})"


class SymbolTokenizer(Tokenizer):
    """A fixed table of symbols, id = 1 + position. Phones are space-separated; chars are characters."""

    def __init__(self, kind: str, symbols: Sequence[str], phone_set: str | None = None):
        if kind not in ("phones", "chars"):
            raise ValueError(f"SymbolTokenizer kind must be 'phones' or 'chars', got {kind!r}")
        if len(set(symbols)) != len(symbols) or not symbols:
            raise ValueError(f"{kind} tokenizer: the symbol table must be non-empty and without repeats")
        self.kind = kind
        self.field = "phones" if kind == "phones" else "text"
        self.symbols = tuple(symbols)
        self.phone_set = phone_set if kind == "phones" else None
        self._ids = {symbol: i + 1 for i, symbol in enumerate(self.symbols)}

    @property
    def vocab_size(self) -> int:
        return len(self.symbols) + 1

    def _split(self, s: str) -> list[str]:
        return s.split() if self.kind == "phones" else list(s)

    def encode(self, s: str) -> list[int]:
        units = self._split(s)
        unknown = sorted({u for u in units if u not in self._ids})
        if unknown:
            shown = ", ".join(repr(u) for u in unknown)
            raise UnknownTokenError(f"{self.kind} tokenizer: unknown {self.kind[:-1]} {shown} in {s!r}", unknown,
                                    self._advice(unknown))
        return [self._ids[u] for u in units]

    def _advice(self, unknown: list[str]) -> str:
        if self.kind == "phones":
            advice = f"the phone inventory ({self.phone_set}) is {' '.join(self.symbols)}"
            if any(strip_stress(u) != u and strip_stress(u) in self._ids for u in unknown):
                advice += " (stress digits must be removed: asr.text.phones.strip_stress)"
            else:
                advice += ("; map the corpus's phones onto it in the recipe (manifests name their set in "
                           "custom['phone_set'])")
        else:
            advice = (f"the character table is {''.join(self.symbols)!r}; normalise the text in the recipe "
                      "(lowercase a-z, apostrophes, single spaces) or rebuild the tokenizer from text that "
                      "contains these characters")
        return advice

    def decode(self, ids: Iterable[int]) -> str:
        symbols = [self.symbols[i - 1] for i in self._check_ids(ids)]
        if self.kind == "phones":
            return " ".join(symbols)
        return " ".join("".join(symbols).split())  # CTC output may start/end with or repeat spaces

    def state_dict(self) -> dict:
        state = {"format": _STATE_FORMAT, "kind": self.kind, "symbols": list(self.symbols)}
        if self.phone_set is not None:
            state["phone_set"] = self.phone_set
        return state


class SentencePieceTokenizer(Tokenizer):
    """A sentencepiece model; our id = sentencepiece id + 1 (0 is the blank)."""

    def __init__(self, model_bytes: bytes, model_type: str):
        import sentencepiece

        self.kind = "sentencepiece"
        self.field = "text"
        self.model_type = model_type
        self._model_bytes = bytes(model_bytes)
        self._processor = sentencepiece.SentencePieceProcessor(model_proto=self._model_bytes)

    def __getstate__(self):   # DataLoader workers get the model's bytes and load the model themselves
        return {key: value for key, value in self.__dict__.items() if key != "_processor"}

    def __setstate__(self, state):
        import sentencepiece

        self.__dict__.update(state)
        self._processor = sentencepiece.SentencePieceProcessor(model_proto=self._model_bytes)

    @property
    def vocab_size(self) -> int:
        return self._processor.vocab_size() + 1

    def encode(self, s: str) -> list[int]:
        pieces = self._processor.encode(s)
        unk = self._processor.unk_id()
        if unk in pieces:
            unseen = sorted({c for c in s if not c.isspace() and self._processor.piece_to_id(c) == unk})
            raise UnknownTokenError(
                f"sentencepiece tokenizer: unknown characters {', '.join(map(repr, unseen))} in {s!r}", unseen,
                "the model was trained on text without them; normalise the text in the recipe (lowercase a-z, "
                "apostrophes, single spaces) or retrain the tokenizer on text that contains them")
        return [p + 1 for p in pieces]

    def decode(self, ids: Iterable[int]) -> str:
        return self._processor.decode([i - 1 for i in self._check_ids(ids)])

    def pieces(self, s: str) -> list[str]:
        """The pieces of `s` as strings (for inspection)."""
        return self._processor.encode(s, out_type=str)

    def state_dict(self) -> dict:
        return {"format": _STATE_FORMAT, "kind": self.kind, "model_type": self.model_type,
                "model": base64.b64encode(self._model_bytes).decode("ascii")}


def train_sentencepiece(texts: Iterable[str], vocab_size: int, model_type: str) -> bytes:
    """Train a sentencepiece model in memory on `texts` and return the serialised model."""
    import sentencepiece

    texts = [t for t in texts if t.strip()]
    if not texts:
        raise ValueError("sentencepiece tokenizer: no training text (every transcript is empty)")
    model = io.BytesIO()
    try:
        sentencepiece.SentencePieceTrainer.train(
            sentence_iterator=iter(texts), model_writer=model, vocab_size=int(vocab_size),
            model_type=model_type, character_coverage=1.0, normalization_rule_name="identity",
            required_chars=NORMALISED_ALPHABET.strip(), bos_id=-1, eos_id=-1, unk_id=0,
            num_threads=1, minloglevel=2)
    except RuntimeError as error:
        limit = re.search(r"<= (\d+)", str(error))
        if limit:
            raise ValueError(
                f"sentencepiece_vocab={vocab_size} is too large for this training text (at most "
                f"{limit.group(1)} pieces can be learned from {len(texts)} transcripts): set "
                f"data.sentencepiece_vocab to at most {limit.group(1)}") from None
        raise ValueError(f"sentencepiece training failed: {error}") from None
    return model.getvalue()


def build_tokenizer(kind: str, train_texts: Iterable[str] | None = None, vocab_size: int = 256,
                    model_type: str = "unigram", phone_set: str = DEFAULT_PHONE_SET) -> Tokenizer:
    """A tokenizer of `kind` ("phones" | "chars" | "sentencepiece").

    `train_texts` (the training transcripts, words) is needed for sentencepiece; for chars it adds
    characters beyond the normalised alphabet; phones ignore it (the inventory `phone_set` is fixed).
    """
    if kind == "phones":
        if phone_set not in PHONE_SETS:
            raise ValueError(f"unknown phone set {phone_set!r}; known: {', '.join(PHONE_SETS)}")
        return SymbolTokenizer("phones", PHONE_SETS[phone_set].symbols, phone_set)
    if kind == "chars":
        extra = sorted({c for t in (train_texts or ()) for c in t} - set(NORMALISED_ALPHABET) - {"\t", "\n"})
        return SymbolTokenizer("chars", tuple(NORMALISED_ALPHABET) + tuple(extra))
    if kind == "sentencepiece":
        if model_type not in SENTENCEPIECE_TYPES:
            raise ValueError(f"sentencepiece model_type {model_type!r} is not one of {SENTENCEPIECE_TYPES}")
        if train_texts is None:
            raise ValueError("a sentencepiece tokenizer must be trained: pass train_texts (the training "
                             "transcripts) or restore one with tokenizer_from_state_dict")
        return SentencePieceTokenizer(train_sentencepiece(train_texts, vocab_size, model_type), model_type)
    raise ValueError(f"unknown tokenizer kind {kind!r}; choose from {', '.join(TOKENIZER_KINDS)}")


def phone_set_of(cuts: CutSet, split: str) -> str:
    """The phone set the manifest names in `custom["phone_set"]` ("arpabet39" where none is named)."""
    names = {(c.supervisions[0].custom or {}).get("phone_set", DEFAULT_PHONE_SET) for c in cuts}
    unknown = sorted(names - set(PHONE_SETS))
    if unknown:
        raise ManifestError(f"{split}: unknown phone_set {unknown} in the manifest; known: {', '.join(PHONE_SETS)}")
    if len(names) > 1:
        raise ManifestError(f"{split}: the manifest mixes phone sets {sorted(names)}; one split, one phone set")
    return names.pop()


def build_tokenizers(kinds: Sequence[str], train_cuts: CutSet, split: str, sentencepiece_vocab: int,
                     sentencepiece_type: str) -> dict[str, Tokenizer]:
    """{kind: tokenizer} for the target `kinds`, from the training split's cuts: their text (chars,
    sentencepiece) and the phone set their manifest names (phones)."""
    phone_set = phone_set_of(train_cuts, split) if "phones" in kinds else DEFAULT_PHONE_SET
    texts = [transcript(cut, "text") for cut in train_cuts]
    tokenizers = {kind: build_tokenizer(kind, texts, sentencepiece_vocab, sentencepiece_type, phone_set)
                  for kind in kinds}
    log.info("tokenizers built from %d training transcripts: %s", len(texts),
             ", ".join(f"{k} ({t.vocab_size} classes)" for k, t in tokenizers.items()))
    return tokenizers


def encode_transcripts(cut, tokenizers: dict[str, Tokenizer]) -> dict[str, list[int]]:
    """{kind: token ids} of one cut's transcripts: what its batch holds (asr.data.batching.dataset)."""
    return {kind: tokenizer.encode(transcript(cut, tokenizer.field)) for kind, tokenizer in tokenizers.items()}


def check_transcripts(cuts: CutSet, tokenizers: dict[str, Tokenizer], split: str,
                      on_encoded: Callable[[object, dict[str, list[int]]], None] | None = None) -> None:
    """Encode every cut's transcripts once, before training: ManifestError when the split's phone set
    is not the phones tokenizer's, or when transcripts hold symbols outside a tokenizer's table (every
    such symbol named, with example cuts). `on_encoded(cut, {kind: ids})` sees each cut's ids; they
    are not kept - a batch encodes its own cuts again, so no split's ids sit in memory (at 1,000 h
    they took ~1 GB: asr/RESULTS.md, "Scale")."""
    phone_set = phone_set_of(cuts, split) if "phones" in tokenizers else None
    if phone_set is not None and tokenizers["phones"].phone_set != phone_set:
        raise ManifestError(f"{split}: the manifest's phones are {phone_set!r} but the phones tokenizer "
                            f"(from the training manifest or the checkpoint) is {tokenizers['phones'].phone_set!r}")
    unknown: dict[tuple[str, str], list[str]] = defaultdict(list)   # (kind, symbol) -> cut ids
    advice: dict[str, str] = {}
    for cut in cuts:
        ids, failed = {}, False
        for kind, tokenizer in tokenizers.items():
            try:
                ids[kind] = tokenizer.encode(transcript(cut, tokenizer.field))
            except UnknownTokenError as error:
                failed = True
                for symbol in error.tokens:
                    unknown[(kind, symbol)].append(cut.id)
                advice.setdefault(kind, error.advice)
        if not failed and on_encoded is not None:
            on_encoded(cut, ids)
    if unknown:
        lines = [f"  {kind} {symbol!r} in {len(ids)} utterances, e.g. {listing(ids, 3)}"
                 for (kind, symbol), ids in sorted(unknown.items())]
        raise ManifestError(f"{split}: transcripts hold symbols outside the tokenizers' tables:\n"
                            + "\n".join(lines) + "\n" + "\n".join(f"  {kind}: {text}" for kind, text in advice.items()))


def tokenizer_from_state_dict(state: dict) -> Tokenizer:
    """Rebuild a tokenizer from `Tokenizer.state_dict()` (e.g. read back from a checkpoint)."""
    if not isinstance(state, dict) or "kind" not in state:
        raise ValueError(f"not a tokenizer state dict (expected a dict with 'kind'): {str(state)[:200]}")
    if state.get("format", _STATE_FORMAT) != _STATE_FORMAT:
        raise ValueError(f"tokenizer state format {state.get('format')} is not supported (this code reads "
                         f"format {_STATE_FORMAT})")
    kind = state["kind"]
    if kind in ("phones", "chars"):
        return SymbolTokenizer(kind, tuple(state["symbols"]), state.get("phone_set", DEFAULT_PHONE_SET))
    if kind == "sentencepiece":
        return SentencePieceTokenizer(base64.b64decode(state["model"]), state.get("model_type", "unigram"))
    raise ValueError(f"unknown tokenizer kind {kind!r} in state dict; choose from {', '.join(TOKENIZER_KINDS)}")

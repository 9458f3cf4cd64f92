"""CTC lexicon decoding with a word n-gram LM, on flashlight-text's beam search (KenLM inside).

    decoder = LexiconDecoder(tokenizer, LexiconDecoderSettings(lexicon="lexicon.txt", lm="lm/3gram.arpa.gz"))
    words = decoder.decode(log_probs)          # (frames, classes) float32 log-probabilities

The search (flashlight-text's LexiconDecoder, the engine of torchaudio's ctc_decoder) only
emits words of the lexicon, spelled in the head's tokens, scoring
    acoustic log-prob + lm_weight * log10 P_LM(word | history) + word_score per word.
Spellings per head: phones read the pronunciation lexicon; sentencepiece spells each lexicon
word with its pieces; chars spell it letter by letter followed by the space token (the word
boundary). Phone and piece heads have no boundary token, so the blank stands in for it.

Everything that can be wrong with the inputs (a missing or malformed lexicon or ARPA file,
lexicon phones the model lacks, an LM that knows none of the lexicon's words) is checked when the
decoder is built, before any decoding, each with one message saying how many and the first few.

Lexicon words the LM does not know are decoded, not refused: flashlight-text's KenLM wrapper maps
every word of the decoder's dictionary to KenLM's vocabulary, and a word KenLM lacks becomes its
<unk> (index 0), so such a word is scored with the LM's <unk> probability in every context (the
history after it backs off as after <unk>). Our ARPA files (asr.evaluation.decoding.ngram) give <unk> the
interpolated unigram share of a word never seen in the text, which is what a lexicon word absent
from the LM's text gets anyway. An ARPA file without a <unk> unigram makes KenLM substitute
log10 p = -100, so its missing words are never chosen in practice: a warning says so.
`restrict_lexicon=True` drops those words instead. `extra_lexicon` adds entries on top of the
lexicon (a word in it replaces that word's pronunciations in the lexicon).
`ParallelLexiconDecoder` spreads utterances over worker processes, each with its own decoder.
"""
from __future__ import annotations

import logging
import math
import os
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Iterable, Iterator, Optional

import numpy as np

from asr.evaluation.decoding.lexicon import LexiconFileError, first_examples, check_lexicon_phones, read_lexicon
from asr.evaluation.decoding.ngram import UNKNOWN_WORD, LanguageModelError, read_arpa_vocabulary

log = logging.getLogger("asr.decoding")
KENLM_MISSING_UNK_LOG10 = -100.0     # what KenLM gives <unk> when the ARPA file has no <unk> unigram


@dataclass
class LexiconDecoderSettings:
    lexicon: str                     # word -> spellings file (phones); for chars/pieces only its words count
    lm: Optional[str] = None         # ARPA file (.arpa or .arpa.gz); None: no LM (lexicon only)
    extra_lexicon: Optional[str] = None  # entries on top of `lexicon` (a word here replaces its spellings there)
    lm_weight: float = 1.0           # times the LM's log10 probability
    word_score: float = 0.0          # added per word (positive: more words)
    unk_score: float = -math.inf     # words outside the lexicon are never emitted
    sil_score: float = 0.0           # per boundary token (chars' space)
    beam: int = 50                   # hypotheses kept per frame
    beam_threshold: float = 25.0     # drop hypotheses this far below the best
    restrict_lexicon: bool = False   # drop lexicon words the LM does not know (else: its <unk> probability)

    def describe(self) -> dict:
        settings = asdict(self)
        settings["unk_score"] = str(self.unk_score) if math.isinf(self.unk_score) else self.unk_score
        return settings


@contextmanager
def _quiet_stderr() -> Iterator[None]:
    """KenLM writes a loading bar and advice to file descriptor 2; keep the terminal clean."""
    try:
        saved = os.dup(2)
    except OSError:
        yield
        return
    with open(os.devnull, "w") as devnull:
        os.dup2(devnull.fileno(), 2)
        try:
            yield
        finally:
            os.dup2(saved, 2)
            os.close(saved)


def head_spellings(tokenizer, lexicon: dict[str, list[tuple[str, ...]]], lexicon_path) -> tuple[dict, int]:
    """(word -> spellings as token ids, the boundary token id) for this head's tokenizer."""
    kind = tokenizer.kind
    if kind == "phones":
        check_lexicon_phones(lexicon, tokenizer.symbols, lexicon_path)
        return {word: [tuple(tokenizer.encode(" ".join(s))) for s in spellings]
                for word, spellings in lexicon.items()}, tokenizer.blank_id
    if kind == "chars":
        space = tokenizer.encode(" ")[0]
        spellings, bad = {}, []
        for word in lexicon:
            try:
                spellings[word] = [tuple(tokenizer.encode(word)) + (space,)]
            except ValueError:
                bad.append(word)
        if bad:
            raise LexiconFileError(f"lexicon file {lexicon_path}: {len(bad)} words have characters the chars "
                                   f"head lacks ({first_examples(bad)})")
        return spellings, space
    if kind == "sentencepiece":
        spellings, bad = {}, []
        for word in lexicon:
            try:
                spellings[word] = [tuple(tokenizer.encode(word))]
            except ValueError:
                bad.append(word)
        if bad:
            raise LexiconFileError(f"lexicon file {lexicon_path}: {len(bad)} words have characters the "
                                   f"sentencepiece head lacks ({first_examples(bad)})")
        return spellings, tokenizer.blank_id
    raise LexiconFileError(f"a {kind} head cannot be decoded with a lexicon")


def check_lm(lm_path: str | Path, words: Iterable[str]) -> tuple[set[str], list[str]]:
    """(the LM's unigram words, the lexicon words it lacks); LanguageModelError when the file is not
    ARPA, is a unigram model, or knows none of the lexicon's words (uppercase words: how to fix)."""
    vocabulary, counts = read_arpa_vocabulary(lm_path)
    if len(counts) < 2:
        raise LanguageModelError(f"LM file {lm_path} is a unigram model; the decoder (KenLM) needs order 2 or more")
    words = list(words)
    missing = [word for word in words if word not in vocabulary]
    if words and len(missing) == len(words):
        upper = sum(word.isupper() for word in vocabulary) > len(vocabulary) // 2
        raise LanguageModelError(
            f"LM file {lm_path} knows none of the lexicon's {len(words)} words ({first_examples(missing)})"
            + ("; its words are uppercase: lowercase it (zcat LM | tr A-Z a-z | gzip > lm.arpa.gz)" if upper
               else "; use an LM over the lexicon's vocabulary (python -m asr.build_lm TEXT --lexicon LEXICON)"))
    return vocabulary, missing


def read_lexicons(settings: LexiconDecoderSettings, tokenizer) -> tuple[dict, int]:
    """(word -> spellings as token ids, the boundary token id) of the lexicon with the extra
    lexicon's entries on top; each file's problems are reported with its own name."""
    spellings, boundary = head_spellings(tokenizer, read_lexicon(settings.lexicon), settings.lexicon)
    if settings.extra_lexicon is not None:
        extra, _ = head_spellings(tokenizer, read_lexicon(settings.extra_lexicon), settings.extra_lexicon)
        spellings.update(extra)
    return spellings, boundary


class LexiconDecoder:
    """A flashlight-text lexicon decoder for one CTC head; built once, decodes utterance by utterance."""

    def __init__(self, tokenizer, settings: LexiconDecoderSettings):
        from flashlight.lib.text.decoder import (CriterionType, LexiconDecoder as EngineDecoder,
                                                 LexiconDecoderOptions, SmearingMode, Trie, ZeroLM)
        from flashlight.lib.text.dictionary import Dictionary

        self.settings = settings
        spellings, boundary = read_lexicons(settings, tokenizer)
        self.lm_vocabulary: set[str] | None = None      # the LM's words (None: no LM)
        self.words_outside_lm: list[str] = []           # decoded with the LM's <unk> probability
        if settings.lm is not None:
            self.lm_vocabulary, missing = check_lm(settings.lm, spellings)
            if settings.restrict_lexicon:
                spellings = {word: s for word, s in spellings.items() if word in self.lm_vocabulary}
            else:
                self.words_outside_lm = missing
                if missing and UNKNOWN_WORD not in self.lm_vocabulary:
                    log.warning("LM file %s has no %s unigram, so KenLM gives the %d lexicon words it lacks (%s) "
                                "log10 p = %g: they will hardly ever be decoded; add <unk> to the LM (asr.build_lm "
                                "writes it) or give restrict_lexicon=true", settings.lm, UNKNOWN_WORD, len(missing),
                                first_examples(missing), KENLM_MISSING_UNK_LOG10)
        spellings.pop(UNKNOWN_WORD, None)                 # the decoder's own unknown-word entry
        self.lexicon_words = set(spellings)
        self.words = list(spellings) + [UNKNOWN_WORD]
        dictionary = Dictionary()
        for word in self.words:
            dictionary.add_entry(word)
        dictionary.set_default_index(len(self.words) - 1)
        if settings.lm is not None:
            from flashlight.lib.text.decoder.kenlm import KenLM
            try:
                with _quiet_stderr():
                    self.lm = KenLM(str(settings.lm), dictionary)
            except RuntimeError as error:
                detail = str(error).strip().splitlines()[-1][:200]
                raise LanguageModelError(f"LM file {settings.lm} cannot be loaded by KenLM: {detail}") from None
        else:
            self.lm = ZeroLM()
        trie = Trie(tokenizer.vocab_size, boundary)
        start = self.lm.start(False)
        for index, word in enumerate(self.words[:-1]):
            _, score = self.lm.score(start, index)
            for spelling in spellings[word]:
                trie.insert(list(spelling), index, score)
        trie.smear(SmearingMode.MAX)
        options = LexiconDecoderOptions(
            beam_size=settings.beam, beam_size_token=tokenizer.vocab_size, beam_threshold=settings.beam_threshold,
            lm_weight=settings.lm_weight, word_score=settings.word_score, unk_score=settings.unk_score,
            sil_score=settings.sil_score, log_add=False, criterion_type=CriterionType.CTC)
        self._trie = trie  # the engine keeps a reference, but keep it alive explicitly
        self._engine = EngineDecoder(options, trie, self.lm, boundary, tokenizer.blank_id,
                                     len(self.words) - 1, [], False)

    def decode(self, log_probs) -> str:
        """The best word sequence for one utterance's (frames, classes) log-probabilities."""
        emissions = np.ascontiguousarray(np.asarray(log_probs, dtype=np.float32))
        frames, classes = emissions.shape
        if frames == 0:
            return ""
        results = self._engine.decode(emissions.ctypes.data, frames, classes)
        if not results:
            return ""
        return " ".join(self.words[i] for i in results[0].words if 0 <= i < len(self.words) - 1)


# ---- decoding in worker processes --------------------------------------------------------------------
_WORKER_DECODER: LexiconDecoder | None = None


def _start_worker(tokenizer_state: dict, settings: LexiconDecoderSettings) -> None:
    global _WORKER_DECODER
    from asr.data.splits.tokenizers import tokenizer_from_state_dict
    _WORKER_DECODER = LexiconDecoder(tokenizer_from_state_dict(tokenizer_state), settings)


def _decode_in_worker(log_probs: np.ndarray) -> str:
    return _WORKER_DECODER.decode(log_probs)


class ParallelLexiconDecoder:
    """A pool of worker processes, each with its own LexiconDecoder, decoding utterances in
    parallel (the engine's decode holds the GIL, so threads would not help) while the caller
    computes the next batch. The inputs are checked in this process first, so a bad file fails
    once, here, before any worker starts."""

    def __init__(self, tokenizer, settings: LexiconDecoderSettings, workers: int | None = None):
        import multiprocessing
        global _WORKER_DECODER
        self.local = LexiconDecoder(tokenizer, settings)      # validates; also decodes when workers == 1
        self.workers = workers if workers is not None else max(1, min(4, os.cpu_count() or 1))
        self.pool = None
        if self.workers > 1:
            if "fork" in multiprocessing.get_all_start_methods():
                # forked workers inherit the built decoder (no second load); they run no torch code
                _WORKER_DECODER = self.local
                self.pool = multiprocessing.get_context("fork").Pool(self.workers)
            else:
                self.pool = multiprocessing.get_context("spawn").Pool(
                    self.workers, initializer=_start_worker, initargs=(tokenizer.state_dict(), settings))

    def submit(self, log_probs: np.ndarray):
        """Starts decoding one utterance; returns something whose .get() is the words."""
        if self.pool is None:
            return _Done(self.local.decode(log_probs))
        return self.pool.apply_async(_decode_in_worker, (np.ascontiguousarray(log_probs, dtype=np.float32),))

    def close(self) -> None:
        if self.pool is not None:
            self.pool.close()
            self.pool.join()
            self.pool = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        if self.pool is not None:
            self.pool.terminate()
            self.pool.join()
            self.pool = None


class _Done:
    def __init__(self, value: str):
        self.value = value

    def get(self) -> str:
        return self.value

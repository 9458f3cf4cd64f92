"""A streamed split on its way to batches: its prepared shards (asr.data.streaming.stream_shards), its
tokenizers and the checks of its transcripts, all from the split's index - no cut is read here.

What the eager path does per cut at every start (asr.data.datamodule, steps 1-4) was done once
when the shards were written; what is left:
- the tokenizers from the index: the phone set, the characters, a sample of the transcripts for
  sentencepiece (`stream_tokenizers`);
- every symbol the split's transcripts use against the tokenizers' tables (the index lists them),
  and phones present where phones are a target (`check_stream_transcripts`);
- CTC feasibility: per batch, when it is built (asr.data.batching.dataset: a training batch leaves such
  utterances out and says so; dev and test keep them, as the eager path does).
"""
from __future__ import annotations

import contextlib
import logging
import os
from dataclasses import dataclass, field
from pathlib import Path

from asr.data.features.features import FilterBank
from asr.data.corpus.manifests import ManifestError
from asr.data.streaming.stream_preparation import prepare_stream
from asr.data.streaming.stream_shards import StreamedFeatures, StreamIndex
from asr.data.splits.tokenizers import Tokenizer, UnknownTokenError, build_tokenizer
from asr.data.augment.waveform_augmentation import speed_factors, transforms_on_the_fly
from asr.text.phones import DEFAULT_PHONE_SET, PHONE_SETS

log = logging.getLogger(__name__)


@dataclass
class StreamedSplit:
    """A split read from its shards: the counterpart of asr.data.splits.cut_checks.SplitData."""

    name: str
    index: StreamIndex
    features: StreamedFeatures
    dropped: dict[str, int] = field(default_factory=dict)
    ctc_infeasible_kept: int = 0     # not known before the batches are built (module doc)

    @property
    def utterances(self) -> int:
        return self.index.cuts

    @property
    def hours(self) -> float:
        return self.index.hours


def open_streamed_split(name: str, manifest: Path, root: Path, folder: Path, filterbank: FilterBank, shard_cuts: int,
                        jobs: int, progress: bool, skip_bad_audio: bool, lock=None,
                        allow_commands: bool = False) -> StreamedSplit:
    """The split's shards in `folder`, written now (under `lock`, resumably) if they are missing or
    not of `manifest` as it is. A finished stream whose manifest is gone is used as it is."""
    index = StreamIndex.open(folder, manifest if Path(manifest).is_file() else None)
    if index is None:
        if not Path(manifest).is_file():
            raise ManifestError(f"manifest {manifest} not found, and no prepared shards of it in {folder}")
        with lock() if lock is not None else contextlib.nullcontext():
            index = prepare_stream(manifest, root, folder, filterbank, shard_cuts, jobs, progress,
                                   skip_bad_audio, description=f"shards {name}", allow_commands=allow_commands)
    elif not Path(manifest).is_file():
        log.info("%s: manifest %s is gone; streaming its prepared shards in %s", name, manifest, folder)
    if index.index["filterbank"] != filterbank.options:
        raise ManifestError(f"{folder} holds features of other filter-bank options than the model's: prepare "
                            "the split again (python -m asr.prepare_shards) or point data.cache_dir elsewhere")
    dropped = {reason: count for reason, count in index.index["dropped"].items() if count}
    if dropped:
        log.warning("%s: %d utterances were left out when its shards were written: %s (the shards' "
                    "summaries in %s name them)", name, sum(dropped.values()), dropped, folder)
    return StreamedSplit(name, index, StreamedFeatures(folder), dropped)


def stream_phone_set(index: StreamIndex, name: str) -> str:
    names = index.index["phone_sets"] or [DEFAULT_PHONE_SET]
    unknown = sorted(set(names) - set(PHONE_SETS))
    if unknown:
        raise ManifestError(f"{name}: unknown phone_set {unknown} in the manifest; known: {', '.join(PHONE_SETS)}")
    if len(names) > 1:
        raise ManifestError(f"{name}: the manifest mixes phone sets {names}; one split, one phone set")
    return names[0]


def stream_tokenizers(kinds, index: StreamIndex, name: str, sentencepiece_vocab: int,
                      sentencepiece_type: str) -> dict[str, Tokenizer]:
    """{kind: tokenizer} from the training split's index (what build_tokenizers takes from its cuts)."""
    phone_set = stream_phone_set(index, name) if "phones" in kinds else DEFAULT_PHONE_SET
    tokenizers = {}
    for kind in kinds:
        texts = index.texts() if kind == "sentencepiece" else [index.index["chars"]]
        tokenizers[kind] = build_tokenizer(kind, texts, sentencepiece_vocab, sentencepiece_type, phone_set)
    log.info("tokenizers built from the index of %s (%d utterances): %s", name, index.cuts,
             ", ".join(f"{k} ({t.vocab_size} classes)" for k, t in tokenizers.items()))
    return tokenizers


def check_stream_transcripts(index: StreamIndex, tokenizers: dict[str, Tokenizer], name: str) -> None:
    """ManifestError when the split's transcripts use a symbol outside a tokenizer's table, or lack
    phones where phones are a target (the eager path's check_transcripts and load_cuts checks)."""
    if "phones" in tokenizers:
        if index.index["no_phones"]:
            raise ManifestError(f"{name}: phone targets are configured (data.targets) but {index.index['no_phones']} "
                                f"utterances in {index.folder} have no phones; remove 'phones' from data.targets or "
                                "prepare the manifests with phones")
        phone_set = stream_phone_set(index, name)
        if tokenizers["phones"].phone_set != phone_set:
            raise ManifestError(f"{name}: the manifest's phones are {phone_set!r} but the phones tokenizer is "
                                f"{tokenizers['phones'].phone_set!r}")
    used = {"phones": " ".join(index.index["phone_symbols"]), "text": index.index["chars"]}
    for kind, tokenizer in tokenizers.items():
        if kind == "sentencepiece":
            continue    # pieces cover any text of the characters it was trained with (required_chars)
        try:
            tokenizer.encode(used[tokenizer.field])
        except UnknownTokenError as error:
            raise ManifestError(f"{name}: transcripts hold symbols outside the {kind} table: "
                                f"{', '.join(map(repr, error.tokens))}; {error.advice}") from None


def choose_streaming(cfg, train_manifest: Path, train_stream: Path, auto_bytes: int) -> bool:
    """data.streaming resolved: true, false, or auto - a training manifest over `auto_bytes`, or
    shards of it already prepared in `train_stream`, unless an option the streaming path cannot take
    is set (they need the audio per batch, or, joined examples, the whole split in manifest order;
    asr/docs/data.md): then auto is the eager path, with a
    warning for a large manifest, and data.streaming=true a ValueError naming them."""
    unsupported = [f"{key}={value}" for key, value in (
        ("data.max_train_utterances", cfg.max_train_utterances),
        ("data.augment.speed", list(cfg.augment.speed) if speed_factors(cfg.augment) else None),
        ("data.augment (waveform transforms)", "on" if transforms_on_the_fly(cfg.augment) else None),
        ("data.precompute_features", None if cfg.precompute_features else False),
        ("data.join_seconds", cfg.join_seconds)) if value is not None]
    if cfg.streaming == "auto":
        size = os.path.getsize(train_manifest) if os.path.isfile(train_manifest) else 0
        large = size > auto_bytes
        if large and unsupported:   # the user's options win over the default; say what streaming would need
            log.warning("data.streaming=auto: the training manifest is %.0f MB, but %s need the eager path (its "
                        "start-up and memory grow with the corpus: asr/docs/data.md, \"Large corpora\")",
                        size / 2**20, ", ".join(unsupported))
        return not unsupported and (large or StreamIndex.open(train_stream, train_manifest) is not None)
    if cfg.streaming and unsupported:
        raise ValueError(f"the streaming data path (data.streaming=true) reads features from prepared shards and "
                         f"does not take {', '.join(unsupported)}: leave these at their defaults, or set "
                         "data.streaming=false")
    return bool(cfg.streaming)

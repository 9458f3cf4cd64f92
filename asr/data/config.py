"""The `data:` section of the config: `DataConfig`, valid by construction.

A DataConfig checks its values when it is made (`__post_init__`): a bad option is a ValueError
naming it and what is allowed. `DataConfig.of(section)` makes one from the composed config's
section (an OmegaConf node or a dict; an unknown key is an error) and checks the one thing that is
a fact of the machine rather than of the values, that the feature cache can be written (or already
exists: a read-only corpus whose features are all cached needs no writing). A run's
start does that once (asr.config.schema) and hands the DataConfig down: the data module, the
corpus (asr.data.corpus.corpus.Corpus.of) and the commands take it as it is.
"""
from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, List, Optional

from asr.data.augment.specaugment import SpecAugment
from asr.data.augment.waveform_augmentation import AugmentConfig, augment_config_from, validate_augment_config
from asr.data.batching.joined_examples import JOIN_BY
from asr.data.splits.tokenizers import SENTENCEPIECE_TYPES, TOKENIZER_KINDS
from asr.data.streaming.stream_shards import MAX_SHARD_CUTS


@dataclass
class DataConfig:
    """The `data:` section of the Hydra config."""

    corpus: str = "synth"                 # manifests are {root}/{corpus}_cuts_{split}.jsonl.gz
    root: str = "data/synth"              # the folder holding the manifests (and, by default, the feature cache)
    train_split: str = "train"            # training split: {root}/{corpus}_cuts_{train_split}.jsonl.gz
    dev_split: str = "dev"                # validation split (picks the best checkpoint)
    test_split: str = "test"              # scored once at the end of asr.train
    # Tokenizer kinds, one CTC head each; the first is the primary one (its error rate picks the best checkpoint).
    targets: List[str] = field(default_factory=lambda: ["phones", "chars"])
    sentencepiece_vocab: int = 256        # sentencepiece pieces incl. <unk>; the head adds the blank
    sentencepiece_type: str = "unigram"   # unigram | bpe
    num_mel_bins: int = 40                # 40 (the paper, WSJ) or 80
    precompute_features: bool = True      # cache fbank (under cache_dir); false: compute per batch
    cache_dir: Optional[str] = None       # the feature cache; None: {root}/features (root must be writable)
    feature_jobs: int = 1                 # processes that precompute features (2 was slower on a shared 2-core box)
    specaugment: bool = True              # training batches only
    freq_masks: int = 2                   # SpecAugment frequency bands masked per utterance
    freq_mask_width: int = 10             # mel bins, each band 0..width wide
    time_masks: int = 2                   # SpecAugment time bands masked per utterance
    time_mask_width: int = 40             # frames (10 ms), each band 0..width wide ...
    time_mask_max_fraction: float = 0.2   # ... and at most this fraction of the utterance
    # waveform augmentation of training utterances (speed, rooms, noise, channel, level): data.augment.KEY
    augment: AugmentConfig = field(default_factory=AugmentConfig)
    max_duration: float = 200.0           # padded seconds per batch: batch size x longest utterance
    num_buckets: int = 10                 # duration buckets; a batch takes utterances of one bucket
    # Long training examples (asr/data/batching/joined_examples.py): consecutive training utterances joined into
    # examples of up to this many seconds (each example's length drawn in [half, all] of it; at most
    # data.max_duration), dev/test untouched; null: every example one utterance
    join_seconds: Optional[float] = None
    join_pause: float = 0.4               # seconds of digital silence between joined utterances (whole frames)
    # which utterances join: speaker (one speaker's, in manifest order, where the manifest names speakers) | none (consecutive ones)
    join_by: str = "speaker"
    # pad every training batch to its bucket's shape (rows x frames), so that training sees at most
    # num_buckets shapes (what trainer.cuda_graphs needs); the padded rows and frames change no loss
    fixed_batch_shapes: bool = False
    num_workers: int = 0                  # DataLoader workers (0 is fastest with precomputed features)
    max_train_utterances: Optional[int] = None  # use only the first N training cuts (quick runs)
    skip_bad_audio: bool = False          # false: missing/corrupt audio is an error listing every cut
    # true: audio may come from shell commands (a manifest source of type "command", a Kaldi wav.scp line
    # ending in '|'), each logged when it first runs; false: such a file is refused before any work
    allow_commands: bool = False
    # The streaming data path for large corpora (asr/data/batching/stream_sampler.py, asr/docs/data.md): every
    # split read from shards prepared once, memory and start-up flat in the corpus's size. true | false |
    # auto: streams when the training manifest is over 50 MB (about 500 h of cuts) or its shards exist,
    # unless an option it cannot take is set (asr/docs/data.md, "Large corpora")
    streaming: Any = "auto"
    stream_shard_cuts: int = 1000         # utterances per shard when a split's shards are written
    stream_window_shards: int = 8         # shards batched together: the shuffle's reach, the memory held
    progress: bool = True                 # progress bars for feature computation
    # a real-speech corpus asr.train also scores at the end (PER, lexicon + LM WER), prepared beside data.root: asterisk; null: none
    real_speech_test: Optional[str] = None

    def __post_init__(self) -> None:
        """Normalises the lists and the augment section, then raises ValueError naming the first bad
        option and what is allowed."""
        self.targets = list(self.targets) if self.targets is not None else []
        self.augment = augment_config_from(self.augment)
        if not self.targets:
            raise ValueError(f"data.targets is empty; choose one or more of {list(TOKENIZER_KINDS)}")
        for kind in self.targets:
            if kind not in TOKENIZER_KINDS:
                raise ValueError(f"data.targets: unknown tokenizer kind {kind!r}; choose from {list(TOKENIZER_KINDS)}")
        if len(set(self.targets)) != len(self.targets):
            raise ValueError(f"data.targets lists a kind twice: {self.targets}")
        if self.sentencepiece_type not in SENTENCEPIECE_TYPES:
            raise ValueError(f"data.sentencepiece_type={self.sentencepiece_type!r}; choose from {list(SENTENCEPIECE_TYPES)}")
        if self.num_mel_bins not in (40, 80):
            raise ValueError(f"data.num_mel_bins={self.num_mel_bins}; choose 40 (the paper) or 80")
        if self.sentencepiece_vocab < 2:
            raise ValueError(f"data.sentencepiece_vocab={self.sentencepiece_vocab} must be at least 2")
        if not self.max_duration > 0:
            raise ValueError(f"data.max_duration={self.max_duration} must be a positive number of seconds")
        if self.num_buckets < 1:
            raise ValueError(f"data.num_buckets={self.num_buckets} must be >= 1")
        if self.num_workers < 0:
            raise ValueError(f"data.num_workers={self.num_workers} must be a number of DataLoader workers >= 0")
        if self.feature_jobs < 1:
            raise ValueError(f"data.feature_jobs={self.feature_jobs} must be a number of processes >= 1")
        if not isinstance(self.allow_commands, bool):
            raise ValueError(f"data.allow_commands={self.allow_commands!r}; give true or false")
        if self.streaming not in (True, False, "auto"):
            raise ValueError(f"data.streaming={self.streaming!r}; choose true, false or auto")
        if not 1 <= self.stream_shard_cuts <= MAX_SHARD_CUTS:
            raise ValueError(f"data.stream_shard_cuts={self.stream_shard_cuts} must lie in [1, {MAX_SHARD_CUTS}]")
        if self.stream_window_shards < 1:
            raise ValueError(f"data.stream_window_shards={self.stream_window_shards} must be >= 1")
        if self.join_seconds is not None and not self.join_seconds > 0:
            raise ValueError(f"data.join_seconds={self.join_seconds} must be a positive number of seconds, or null "
                             "(one utterance per training example)")
        if self.join_seconds is not None and self.join_seconds > self.max_duration:
            raise ValueError(f"data.join_seconds={self.join_seconds} is longer than data.max_duration={self.max_duration} "
                             "(the padded seconds of a batch), so no batch could hold a joined example: raise "
                             f"data.max_duration to at least {self.join_seconds} or lower data.join_seconds")
        if not self.join_pause >= 0:
            raise ValueError(f"data.join_pause={self.join_pause} must be a number of seconds >= 0")
        if self.join_by not in JOIN_BY:
            raise ValueError(f"data.join_by={self.join_by!r}; choose one of {', '.join(JOIN_BY)}")
        if self.max_train_utterances is not None and self.max_train_utterances < 1:
            raise ValueError(f"data.max_train_utterances={self.max_train_utterances} must be >= 1 or null")
        SpecAugment(self.freq_masks, self.freq_mask_width, self.time_masks, self.time_mask_width,
                    self.time_mask_max_fraction)  # validates its own options
        validate_augment_config(self.augment)

    @classmethod
    def of(cls, section: Any) -> "DataConfig":
        """The data section of a run (a DataConfig, an OmegaConf node or a dict; an unknown key is an
        error), its values checked, and its feature cache writable when features are precomputed."""
        if isinstance(section, cls):
            data = section
        else:
            try:
                from omegaconf import DictConfig, OmegaConf

                if isinstance(section, DictConfig):
                    section = OmegaConf.to_container(section, resolve=True)
            except ImportError:
                pass
            if not isinstance(section, dict):
                raise TypeError(f"data config must be a DataConfig, a dict or an OmegaConf node, "
                                f"got {type(section).__name__}")
            known = {f.name for f in dataclasses.fields(cls)}
            unknown = sorted(set(section) - known)
            if unknown:
                raise ValueError(f"unknown data options {unknown}; the data options are: {', '.join(sorted(known))}")
            data = cls(**section)
        data.check_feature_cache(existing_cache_suffices=True)
        return data

    @property
    def feature_cache_folder(self) -> Path:
        """Where the features are cached: data.cache_dir, or by default {data.root}/features."""
        return Path(self.cache_dir) if self.cache_dir else Path(os.fspath(self.root)).expanduser() / "features"

    def check_feature_cache(self, existing_cache_suffices: bool = False) -> None:
        """ValueError when features are to be precomputed and their cache folder cannot be written.
        `existing_cache_suffices`: a cache folder that exists passes, written or not (a read-only corpus
        whose features were computed before); the data module then refuses a split whose features are
        not all there (`feature_cache_error`), before computing any."""
        if not self.precompute_features or can_write(self.feature_cache_folder):
            return
        if existing_cache_suffices and self.feature_cache_folder.is_dir():
            return
        raise ValueError(self.feature_cache_error())

    def feature_cache_error(self, missing: str = "") -> str:
        """The message for a feature cache that must be written and cannot be; `missing` says what it lacks."""
        lacks = f" and lacks {missing}" if missing else ""
        if self.cache_dir:
            return (f"data.cache_dir={self.cache_dir!r} is not writable{lacks}; give a folder you can write to")
        return (f"the feature cache {self.feature_cache_folder} cannot be written (data.root={self.root!r} is "
                f"read-only){lacks}: give a writable folder with data.cache_dir=FOLDER (features are computed once "
                f"and reused from there), or data.precompute_features=false to compute them per batch")


def can_write(path: Path) -> bool:
    """Whether `path` can be written or created: the nearest existing folder on its way is writable
    (os.access: for root, who may write anywhere, a read-only permission bit does not count)."""
    for candidate in (path, *path.absolute().parents):
        if candidate.exists():
            return candidate.is_dir() and os.access(candidate, os.W_OK | os.X_OK)
    return False

"""The data section of the config (`DataConfig`) and the Lightning DataModule that serves batches.

A split's way through the data layer reads top to bottom in `SpeechDataModule.split` (steps 1-4)
and `SpeechDataModule.dataloader` (steps 5-6); each step is one call into the module that owns it:

1. load the cuts: read the manifest and check its structure (`manifests.load_cuts`);
2. check and drop bad ones: missing/unreadable/unusable audio fails at once with the full list of
   cuts and files, or - with `data.skip_bad_audio=true` - is left out and counted; empty transcripts
   are left out and counted (`cut_checks.drop_unusable_cuts`);
3. check targets: the tokenizers (built from the training text unless `set_tokenizers` gave them,
   e.g. from a checkpoint) encode every transcript once (the training split first gains its
   speed-perturbed copies, `data.augment.speed`); a symbol outside a tokenizer's table fails
   with every offending symbol and example cuts (`tokenizers.check_transcripts`). The ids are not
   kept: each batch encodes its own transcripts (step 5), only cuts CTC may not align are noted;
4. attach features: compute (or reuse) the cached features, or plan to compute them per batch
   (`feature_cache.attach_features`); then audio found corrupt there (`cut_checks.drop_bad_audio`) and
   utterances CTC cannot align (`cut_checks.drop_ctc_infeasible`: more targets than encoder frames)
   are dealt with;
5. build the dataset: cuts -> padded tensors and their transcripts' ids; for training, waveform
   augmentation drawn per utterance and epoch (`waveform_augmentation`) and SpecAugment
   (`dataset.SpeechBatchDataset`);
6. build the sampler: duration-bucketed batches, this process's share (`batching.duration_bucketing_sampler`);
   with `data.join_seconds` the training split's batches are of long examples, consecutive
   utterances joined with a pause (`joined_examples.join_utterances`; step 5 joins their features).

Steps 1-4 run once per split and what they give is kept (`cut_checks.SplitData`); 5-6 are made for
each loader (they depend on `train`, this process's rank and the epoch). `setup(stage)` takes every
split of its stage through steps 1-3 before any split's features are computed, so bad input is
reported before minutes are spent; features already computed are kept on disk whatever fails later.

A corpus too large for this (data.streaming, by default from 50 MB of training manifest) takes the
streaming path instead: `split()` opens the split's shards, prepared once with steps 1-4 done
(asr.data.streamed_split), and step 6 is asr.data.stream_sampler's sampler; nothing per cut is
kept in memory (asr/docs/data.md, "Large corpora").

The global mean/std (`feature_mean`, `feature_std`) are over all frames of the kept training
utterances, or of `feature_stats.STATS_SAMPLE_CUTS` of them evenly spread where the split has more;
they are computed on first use and cached next to the features.
"""

from __future__ import annotations

import dataclasses
import logging
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, List, Optional

import lightning
import torch
from lhotse import CutSet

from asr.data.augmentation import SpecAugment
from asr.data.batching import FixedBatchShapes, duration_bucketing_sampler
from asr.data.cut_checks import (SplitData, drop_bad_audio, drop_ctc_infeasible, drop_unusable_cuts,
                                 note_ctc_candidate)
from asr.data.dataset import SpeechBatchDataset
from asr.data.feature_cache import StoredFeatures, attach_features, feature_directory
from asr.data.feature_stats import FeatureStats, global_feature_stats, statistics_sample
from asr.data.joined_examples import JOIN_BY, join_utterances, pause_between
from asr.data.features import FilterBank
from asr.data.corpus import Corpus
from asr.data.manifests import load_cuts
from asr.data.stream_sampler import StreamingBucketSampler, plan_buckets
from asr.data.stream_shards import MAX_SHARD_CUTS, stream_folder
from asr.data.streamed_split import (StreamedSplit, check_stream_transcripts, choose_streaming, open_streamed_split,
                                     stream_tokenizers)
from asr.data.tokenizers import (SENTENCEPIECE_TYPES, TOKENIZER_KINDS, Tokenizer, build_tokenizers,
                                 check_transcripts, tokenizer_from_state_dict)
from asr.data.vtlp import VocalTractLengthPerturbation
from asr.data.waveform_augmentation import (AugmentConfig, WaveformAugmenter, augment_config_from, speed_factors,
                                            transforms_on_the_fly, validate_augment_config, with_speed_copies)

log = logging.getLogger(__name__)

# data.streaming=auto streams a corpus whose training manifest is larger (~500 h of lhotse cuts): from
# there the eager path's start-up and memory grow past what the streaming one needs (asr/RESULTS.md, "Scale")
AUTO_STREAMING_BYTES = 50 * 1024 ** 2


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
    # Long training examples (asr/data/joined_examples.py): consecutive training utterances joined into
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
    # The streaming data path for large corpora (asr/data/stream_sampler.py, asr/docs/data.md): every
    # split read from shards prepared once, memory and start-up flat in the corpus's size. true | false |
    # auto: streams when the training manifest is over 50 MB (about 500 h of cuts) or its shards exist,
    # unless an option it cannot take is set (asr/docs/data.md, "Large corpora")
    streaming: Any = "auto"
    stream_shard_cuts: int = 1000         # utterances per shard when a split's shards are written
    stream_window_shards: int = 8         # shards batched together: the shuffle's reach, the memory held
    progress: bool = True                 # progress bars for feature computation
    # a real-speech corpus asr.train also scores at the end (PER, lexicon + LM WER), prepared beside data.root: asterisk; null: none
    real_speech_test: Optional[str] = None


def as_data_config(cfg: Any) -> DataConfig:
    """A DataConfig from a DataConfig, an OmegaConf node or a dict; unknown keys are an error."""
    if isinstance(cfg, DataConfig):
        return cfg
    try:
        from omegaconf import DictConfig, OmegaConf

        if isinstance(cfg, DictConfig):
            cfg = OmegaConf.to_container(cfg, resolve=True)
    except ImportError:
        pass
    if not isinstance(cfg, dict):
        raise TypeError(f"data config must be a DataConfig, a dict or an OmegaConf node, got {type(cfg).__name__}")
    known = {f.name for f in dataclasses.fields(DataConfig)}
    unknown = sorted(set(cfg) - known)
    if unknown:
        raise ValueError(f"unknown data options {unknown}; the data options are: {', '.join(sorted(known))}")
    cfg = dict(cfg)
    if cfg.get("targets") is not None:
        cfg["targets"] = list(cfg["targets"])
    if "augment" in cfg:
        cfg["augment"] = augment_config_from(cfg["augment"])
    return DataConfig(**cfg)


def feature_cache_folder(cfg: DataConfig) -> Path:
    """Where the features are cached: data.cache_dir, or by default {data.root}/features."""
    return Path(cfg.cache_dir) if cfg.cache_dir else Corpus.of(cfg).root / "features"


def can_write(path: Path) -> bool:
    """Whether `path` can be written or created: the nearest existing folder on its way is writable
    (os.access: for root, who may write anywhere, a read-only permission bit does not count)."""
    for candidate in (path, *path.absolute().parents):
        if candidate.exists():
            return candidate.is_dir() and os.access(candidate, os.W_OK | os.X_OK)
    return False


def validate_data_config(cfg: DataConfig) -> None:
    """Raise ValueError naming the first bad option and what is allowed."""
    if not cfg.targets:
        raise ValueError(f"data.targets is empty; choose one or more of {list(TOKENIZER_KINDS)}")
    for kind in cfg.targets:
        if kind not in TOKENIZER_KINDS:
            raise ValueError(f"data.targets: unknown tokenizer kind {kind!r}; choose from {list(TOKENIZER_KINDS)}")
    if len(set(cfg.targets)) != len(cfg.targets):
        raise ValueError(f"data.targets lists a kind twice: {cfg.targets}")
    if cfg.sentencepiece_type not in SENTENCEPIECE_TYPES:
        raise ValueError(f"data.sentencepiece_type={cfg.sentencepiece_type!r}; choose from {list(SENTENCEPIECE_TYPES)}")
    if cfg.num_mel_bins not in (40, 80):
        raise ValueError(f"data.num_mel_bins={cfg.num_mel_bins}; choose 40 (the paper) or 80")
    if cfg.sentencepiece_vocab < 2:
        raise ValueError(f"data.sentencepiece_vocab={cfg.sentencepiece_vocab} must be at least 2")
    if not cfg.max_duration > 0:
        raise ValueError(f"data.max_duration={cfg.max_duration} must be a positive number of seconds")
    if cfg.num_buckets < 1:
        raise ValueError(f"data.num_buckets={cfg.num_buckets} must be >= 1")
    if cfg.num_workers < 0 or cfg.feature_jobs < 1:
        raise ValueError(f"data.num_workers={cfg.num_workers} must be >= 0 and data.feature_jobs="
                         f"{cfg.feature_jobs} >= 1")
    if not isinstance(cfg.allow_commands, bool):
        raise ValueError(f"data.allow_commands={cfg.allow_commands!r}; give true or false")
    if cfg.streaming not in (True, False, "auto"):
        raise ValueError(f"data.streaming={cfg.streaming!r}; choose true, false or auto")
    if not 1 <= cfg.stream_shard_cuts <= MAX_SHARD_CUTS or cfg.stream_window_shards < 1:
        raise ValueError(f"data.stream_shard_cuts={cfg.stream_shard_cuts} must lie in [1, {MAX_SHARD_CUTS}] and "
                         f"data.stream_window_shards={cfg.stream_window_shards} be >= 1")
    if cfg.join_seconds is not None and not cfg.join_seconds > 0:
        raise ValueError(f"data.join_seconds={cfg.join_seconds} must be a positive number of seconds, or null "
                         "(one utterance per training example)")
    if cfg.join_seconds is not None and cfg.join_seconds > cfg.max_duration:
        raise ValueError(f"data.join_seconds={cfg.join_seconds} is longer than data.max_duration={cfg.max_duration} "
                         "(the padded seconds of a batch), so no batch could hold a joined example: raise "
                         f"data.max_duration to at least {cfg.join_seconds} or lower data.join_seconds")
    if not cfg.join_pause >= 0:
        raise ValueError(f"data.join_pause={cfg.join_pause} must be a number of seconds >= 0")
    if cfg.join_by not in JOIN_BY:
        raise ValueError(f"data.join_by={cfg.join_by!r}; choose one of {', '.join(JOIN_BY)}")
    if cfg.max_train_utterances is not None and cfg.max_train_utterances < 1:
        raise ValueError(f"data.max_train_utterances={cfg.max_train_utterances} must be >= 1 or null")
    SpecAugment(cfg.freq_masks, cfg.freq_mask_width, cfg.time_masks, cfg.time_mask_width,
                cfg.time_mask_max_fraction)  # validates its own options
    validate_augment_config(cfg.augment)
    if cfg.precompute_features and not can_write(feature_cache_folder(cfg)):
        if cfg.cache_dir:
            raise ValueError(f"data.cache_dir={cfg.cache_dir!r} is not writable; give a folder you can write to")
        raise ValueError(
            f"the feature cache {feature_cache_folder(cfg)} cannot be written (data.root={cfg.root!r} is read-only): "
            f"give a writable folder with data.cache_dir=FOLDER (features are computed once and reused from "
            f"there), or data.precompute_features=false to compute them per batch")


class SpeechDataModule(lightning.LightningDataModule):
    """Serves padded batches of fbank features and CTC targets from lhotse manifests.

    `frame_subsampling`: how many feature frames the encoder turns into one output frame (for the
    CTC feasibility filter). `seed`: sampler shuffling (epoch e uses seed + e, via `set_epoch`) and
    SpecAugment draws. `cache_lock`: for processes that share the feature cache (asr.train's
    processes of one run), a context manager factory held by one process at a time while it writes
    the cache (features, statistics); reading needs no lock (feature_cache.precompute_features).
    """

    def __init__(self, cfg: DataConfig | Any, frame_subsampling: int = 1, seed: int = 0,
                 filterbank: FilterBank | None = None, cache_lock=None):
        super().__init__()
        self.cfg = as_data_config(cfg)
        validate_data_config(self.cfg)
        self.corpus = Corpus.of(self.cfg)   # data.corpus and data.root, resolved once
        if frame_subsampling < 1:
            raise ValueError(f"frame_subsampling={frame_subsampling} must be >= 1")
        self.frame_subsampling = int(frame_subsampling)
        self.seed = int(seed)
        self.cache_lock = cache_lock
        # filterbank: a trained model's front-end (SpeechRecognizer.frontend) when evaluating it
        self.filterbank = filterbank if filterbank is not None else FilterBank(self.cfg.num_mel_bins)
        if self.filterbank.num_mel_bins != self.cfg.num_mel_bins:
            raise ValueError(f"data.num_mel_bins={self.cfg.num_mel_bins}, but the front-end given computes "
                             f"{self.filterbank.num_mel_bins} bins")
        self._tokenizers: dict[str, Tokenizer] | None = None
        self._splits: dict[str, SplitData] = {}      # what steps 1-4 give, per split (the module doc)
        self._stats: FeatureStats | None = None
        self._start_epoch = 0            # the first training epoch of this fit (restored from a checkpoint)
        self._train_sampler = None
        self._training_originals: list = []   # the training cuts before speed copies: babble's talkers
        self._streaming: bool | None = None   # data.streaming, resolved on first use
        self._stream_position: dict | None = None   # where a resumed streamed epoch goes on (state_dict)

    # ----- a split's way: manifest -> checked cuts -> targets -> features -> dataset -> sampler -----
    def setup(self, stage: str | None = None) -> None:
        names = self._stage_splits(stage)
        for name in names:     # steps 1-3 for every split first: bad input is reported before features take minutes
            self.split(name, features=False)
        for name in names:
            self.split(name)
        if stage in (None, "fit"):
            self.feature_stats  # noqa: B018 - SpecAugment and the model need it: compute it now

    def split(self, name: str, features: bool = True) -> SplitData:
        """The split `name` ready to batch: steps 1-4 of the module doc, each one call into the module
        that owns it. What they give is kept, so each runs once per split; `features=False` stops
        before step 4 (setup() checks every split of its stage that way first)."""
        if self.streaming:
            return self._streamed_split(name)
        cfg = self.cfg
        data = self._splits.get(name)
        if data is None:
            if self._tokenizers is None and name != cfg.train_split:
                self.split(cfg.train_split, features=False)   # step 3 needs the training text's tokenizers
            # 1. load the cuts
            cuts = load_cuts(self.corpus.root, self.corpus.name, name, need_phones="phones" in cfg.targets,
                             limit=cfg.max_train_utterances if name == cfg.train_split else None,
                             allow_commands=cfg.allow_commands)
            # 2. check and drop bad ones
            data = drop_unusable_cuts(name, cuts, "phones" in cfg.targets, cfg.max_duration, self.filterbank,
                                      cfg.skip_bad_audio)
            # 3. encode targets (the training split builds the tokenizers, unless a checkpoint gave them)
            if self._tokenizers is None:
                self._tokenizers = build_tokenizers(cfg.targets, data.cuts, name, cfg.sentencepiece_vocab,
                                                    cfg.sentencepiece_type)
            if name == cfg.train_split:   # speed-perturbed copies join the training set (their features are cached)
                self._training_originals = list(data.cuts)
                data.cuts = with_speed_copies(data.cuts, speed_factors(cfg.augment))
            check_transcripts(data.cuts, self._tokenizers, name, on_encoded=lambda cut, ids: note_ctc_candidate(
                data, cut, ids, self.filterbank, self.frame_subsampling))
            self._splits[name] = data
        if features and data.features is None:
            # 4. attach features; leave out audio found corrupt there, and what CTC cannot align
            data.features, failures = attach_features(data.cuts, self.filterbank, cfg.precompute_features,
                                                      feature_cache_folder(cfg), name, cfg.feature_jobs, cfg.progress,
                                                      self.cache_lock)
            drop_bad_audio(data, failures, cfg.skip_bad_audio)
            drop_ctc_infeasible(data, self.frame_subsampling, is_train=name == cfg.train_split)
            log.info("%s %s: %d utterances, %.2f h%s", cfg.corpus, name, len(data.cuts), data.hours,
                     f"; dropped {data.dropped}" if data.dropped else "")
        return data

    @property
    def streaming(self) -> bool:
        """Whether the splits are read from streaming shards (data.streaming; auto: see DataConfig)."""
        if self._streaming is None:
            train = self.cfg.train_split
            self._streaming = choose_streaming(self.cfg, self.corpus.cuts_path(train),
                                               stream_folder(self.feature_directory / train), AUTO_STREAMING_BYTES)
        return self._streaming

    def _streamed_split(self, name: str) -> StreamedSplit:
        """A split from its streaming shards, prepared now if they are missing (asr.data.streamed_split)."""
        cfg = self.cfg
        data = self._splits.get(name)
        if data is None:
            if self._tokenizers is None and name != cfg.train_split:
                self._streamed_split(cfg.train_split)   # the tokenizers come from the training split's index
            data = open_streamed_split(name, self.corpus.cuts_path(name), self.corpus.root,
                                       stream_folder(self.feature_directory / name), self.filterbank,
                                       cfg.stream_shard_cuts, cfg.feature_jobs, cfg.progress, cfg.skip_bad_audio,
                                       self.cache_lock, allow_commands=cfg.allow_commands)
            if self._tokenizers is None:
                self._tokenizers = stream_tokenizers(cfg.targets, data.index, name, cfg.sentencepiece_vocab,
                                                     cfg.sentencepiece_type)
            check_stream_transcripts(data.index, self._tokenizers, name)
            self._splits[name] = data
            log.info("%s %s: %d utterances, %.2f h in %d shards (streamed)", cfg.corpus, name, data.utterances,
                     data.hours, data.index.shards)
        return data

    def _stream_sampler(self, data: StreamedSplit, train: bool) -> StreamingBucketSampler:
        cfg = self.cfg
        buckets = plan_buckets(data.index, cfg.num_buckets, cfg.max_duration)
        fixed = FixedBatchShapes(buckets.bounds, cfg.max_duration, 1000.0 / self.filterbank.frame_shift_ms) \
            if train and cfg.fixed_batch_shapes else None
        rank, world_size = self.process_rank()
        return StreamingBucketSampler(data.index, buckets, shuffle=train, seed=self.seed, rank=rank,
                                      world_size=world_size, window_shards=cfg.stream_window_shards,
                                      fixed_shapes=fixed)

    def dataloader(self, split_name: str, train: bool = False) -> torch.utils.data.DataLoader:
        """Batches of any split (steps 5-6 of the module doc on `split()`); `train=True` shuffles and
        applies SpecAugment (if configured).

        The sampler is deterministic from the seed and the epoch (Lightning calls `set_epoch`). Under
        DDP each rank gets its own share (`process_rank`), every utterance of a split exactly once over
        all ranks (the Trainer must use `use_distributed_sampler=False`, as asr.train does).
        """
        cfg = self.cfg
        data = self.split(split_name)
        # 5. build the dataset
        specaugment = SpecAugment(cfg.freq_masks, cfg.freq_mask_width, cfg.time_masks, cfg.time_mask_width,
                                  cfg.time_mask_max_fraction) if train and cfg.specaugment else None
        augmenter = WaveformAugmenter(cfg.augment, self.seed, self.filterbank, self._training_originals,
                                      cfg.allow_commands) \
            if train and transforms_on_the_fly(cfg.augment) else None
        vtlp = VocalTractLengthPerturbation(cfg.augment.vtlp_prob, cfg.augment.vtlp_warp_range, self.seed,
                                            self.filterbank) if train and cfg.augment.vtlp_prob > 0 else None
        # a streamed training split finds the utterances CTC cannot align per batch (asr.data.streamed_split)
        ctc_check = self.frame_subsampling if train and self.streaming else None
        pause = pause_between(self.filterbank, cfg.join_pause) if train and cfg.join_seconds is not None else None
        dataset = SpeechBatchDataset(self._tokenizers, data.features, specaugment,
                                     self.feature_mean if specaugment is not None else None, self.seed, augmenter, vtlp,
                                     ctc_check, pause)
        # 6. build the sampler
        if self.streaming:
            sampler = self._stream_sampler(data, train)
        else:
            rank, world_size = self.process_rank()
            frame_rate = 1000.0 / self.filterbank.frame_shift_ms if train and cfg.fixed_batch_shapes else None
            # after the statistics (feature_mean above), which may leave out audio found corrupt
            examples = self._joined_examples(data.cuts, pause) if pause is not None else data.cuts
            sampler = duration_bucketing_sampler(examples, cfg.max_duration, cfg.num_buckets, shuffle=train,
                                                 seed=self.seed, rank=rank, world_size=world_size,
                                                 fixed_shapes_frames_per_second=frame_rate)
        return torch.utils.data.DataLoader(
            dataset, sampler=sampler, batch_size=None, num_workers=cfg.num_workers,
            persistent_workers=cfg.num_workers > 0,
            # its own generator: making an iterator draws a seed, and from torch's global generator that
            # draw would shift dropout after a resume that makes one iterator more (asr.model.recognizer)
            generator=torch.Generator().manual_seed(self.seed))

    def _joined_examples(self, cuts: CutSet, pause) -> CutSet:
        """The training split's utterances joined into long examples (data.join_seconds); the same on
        every process and in every epoch of the run (asr.data.joined_examples)."""
        cfg = self.cfg
        examples = join_utterances(cuts, cfg.join_seconds, pause, cfg.join_by, self.seed)
        durations = [example.duration for example in examples]
        log.info("data.join_seconds=%g: %d training utterances joined into %d examples of %.1f-%.1f s (mean %.1f s)",
                 cfg.join_seconds, len(cuts), len(examples), min(durations), max(durations),
                 sum(durations) / len(durations))
        return CutSet.from_cuts(examples)

    def _stage_splits(self, stage: str | None) -> list[str]:
        cfg = self.cfg
        if stage in (None, "fit"):
            return [cfg.train_split, cfg.dev_split]
        if stage == "validate":
            return [cfg.dev_split]
        if stage in ("test", "predict"):
            return [cfg.test_split]
        raise ValueError(f"unknown stage {stage!r}; expected fit, validate, test or predict")

    def report(self) -> dict[str, dict]:
        """Per prepared split: utterances kept, hours, dropped by reason, CTC-infeasible kept."""
        return {name: {"utterances": d.utterances, "hours": d.hours, "dropped": dict(d.dropped),
                       "ctc_infeasible_kept": d.ctc_infeasible_kept}
                for name, d in self._splits.items() if d.features is not None}

    # ----- tokenizers -------------------------------------------------------------------------
    @property
    def tokenizers(self) -> dict[str, Tokenizer]:
        if self._tokenizers is None:
            raise RuntimeError("tokenizers are built in setup(); call setup() or set_tokenizers() first")
        return self._tokenizers

    def set_tokenizers(self, states: dict[str, dict]) -> None:
        """Use these tokenizers (state dicts, e.g. from a checkpoint) instead of building them."""
        if self._splits:
            raise RuntimeError("set_tokenizers() must be called before setup()")
        missing = [kind for kind in self.cfg.targets if kind not in states]
        if missing:
            raise ValueError(f"set_tokenizers: no tokenizer for targets {missing} (data.targets="
                             f"{self.cfg.targets}; given: {sorted(states)})")
        tokenizers = {kind: tokenizer_from_state_dict(states[kind]) for kind in self.cfg.targets}
        wrong = [f"{kind} (is {t.kind})" for kind, t in tokenizers.items() if t.kind != kind]
        if wrong:
            raise ValueError(f"set_tokenizers: state dicts of the wrong kind for {wrong}")
        self._tokenizers = tokenizers

    # ----- features and statistics ------------------------------------------------------------
    @property
    def feature_dim(self) -> int:
        return self.cfg.num_mel_bins

    @property
    def feature_directory(self) -> Path:
        return feature_directory(feature_cache_folder(self.cfg), self.filterbank)

    @property
    def feature_stats(self) -> FeatureStats:
        """Mean/std over all frames of the kept training utterances, or of an even sample of them in a
        large split (module doc); computed once, cached on disk."""
        if self._stats is None and self.streaming:   # over every frame, summed when the shards were written
            self._stats = self.split(self.cfg.train_split).index.feature_stats
        if self._stats is None:
            train = self.split(self.cfg.train_split)
            store = train.features.store if isinstance(train.features, StoredFeatures) else None
            stats, failures = global_feature_stats(
                statistics_sample(train.cuts), self.filterbank, self.feature_directory / train.name, store,
                self.cfg.feature_jobs, self.cfg.progress, self.cache_lock)
            # only in on-the-fly mode: audio corrupt past its header; stats exclude these
            drop_bad_audio(train, failures, self.cfg.skip_bad_audio)
            self._stats = stats
            log.info("feature statistics over %d training frames", stats.num_frames)
        return self._stats

    @property
    def feature_mean(self) -> torch.Tensor:
        return torch.tensor(self.feature_stats.mean, dtype=torch.float32)

    @property
    def feature_std(self) -> torch.Tensor:
        return torch.tensor(self.feature_stats.std, dtype=torch.float32)

    # ----- loaders ------------------------------------------------------------------------------
    def process_rank(self) -> tuple[int, int]:
        """(rank, world size) of this process: the Trainer's when one is attached, else
        torch.distributed's when it is initialised, else (0, 1). Never the RANK / WORLD_SIZE
        environment variables alone: a launcher may set them for a job this loader is not part of."""
        trainer = getattr(self, "trainer", None)
        if trainer is not None:
            return trainer.global_rank, trainer.world_size
        if torch.distributed.is_available() and torch.distributed.is_initialized():
            return torch.distributed.get_rank(), torch.distributed.get_world_size()
        return 0, 1

    def train_dataloader(self):
        loader = self.dataloader(self.cfg.train_split, train=True)
        # Lightning creates the loader's iterator (and prefetches a batch) before its first set_epoch of
        # a fit, and lhotse fixes an epoch's order at iter(): a resumed run would replay epoch 0's
        # order. So the epoch to start with travels in the checkpoint (state_dict) and is set here.
        loader.sampler.set_epoch(self._start_epoch)
        if self._stream_position is not None and self._stream_position["epoch"] == self._start_epoch:
            loader.sampler.resume_at(self._stream_position)   # mid-epoch: every batch done stays done
        self._train_sampler = loader.sampler
        return loader

    def state_dict(self) -> dict:
        """Saved in Lightning checkpoints: the training epoch a resumed run starts with, and for a
        streamed split the position in it (asr.data.stream_sampler: the same on every process)."""
        sampler = self._train_sampler
        if isinstance(sampler, StreamingBucketSampler):
            # the steps trained, not the batches drawn: the loader draws ahead of training
            trainer = getattr(self, "trainer", None)
            steps = trainer.fit_loop.epoch_loop.batch_progress.current.processed if trainer is not None else 0
            position = sampler.position_after(steps)
            return {"next_train_epoch": sampler.epoch if position is not None else sampler.epoch + 1,
                    "stream_position": position}
        return {"next_train_epoch": sampler.next_epoch if sampler is not None else self._start_epoch}

    def load_state_dict(self, state_dict: dict) -> None:
        self._start_epoch = int(state_dict.get("next_train_epoch", 0))
        self._stream_position = state_dict.get("stream_position")

    def val_dataloader(self):
        return self.dataloader(self.cfg.dev_split)

    def test_dataloader(self):
        return self.dataloader(self.cfg.test_split)

    def predict_dataloader(self):
        return self.dataloader(self.cfg.test_split)

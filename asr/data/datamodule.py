"""The data section of the config (`DataConfig`) and the Lightning DataModule that serves batches.

`SpeechDataModule.setup(stage)` runs, per split, in this order:

1. load the cuts manifest and check its structure (`manifests.load_cuts`);
2. find per-utterance problems: empty transcripts (text, or phones when phone targets are used) are
   skipped and counted; missing/unreadable audio fails at once with the full list of cuts and files,
   or - with `data.skip_bad_audio=true` - is skipped and counted;
3. build the tokenizers from the training text (unless `set_tokenizers` gave them, e.g. from a
   checkpoint) and encode every transcript; a symbol outside a tokenizer's table fails with every
   offending symbol and example cuts;
4. compute (or reuse) the features (`feature_cache`), or plan to compute them per batch;
5. CTC feasibility: a training utterance whose targets need more frames than the encoder gives
   (T // frame_subsampling, with a blank between repeated tokens) is dropped and counted; in dev/test
   such utterances are kept (error rates must cover the whole set) and counted - their CTC loss is
   infinite, so the loss should use `zero_infinity=True`.

Steps 1-3 run for every split of the stage before any feature is computed, so bad input is reported
before minutes are spent; features already computed are kept on disk whatever fails later.

The global mean/std (`feature_mean`, `feature_std`) are over all frames of the kept training
utterances; they are computed on first use and cached next to the features.
"""

from __future__ import annotations

import dataclasses
import logging
import os
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, List, Optional

import lightning
import torch
from lhotse import CutSet

from asr.data.augmentation import SpecAugment
from asr.data.cut_checks import find_unusable_cuts
from asr.data.batching import duration_bucketing_sampler
from asr.data.dataset import OnTheFlyFeatures, SpeechBatchDataset, StoredFeatures, ctc_min_frames
from asr.data.feature_cache import FeatureStats, feature_directory, global_feature_stats, precompute_features
from asr.data.features import FilterBank
from asr.data.manifests import (ManifestError, UtteranceProblems, find_empty_transcripts,
                                listing, load_cuts, phone_set_of, transcript)
from asr.data.tokenizers import (DEFAULT_PHONE_SET, SENTENCEPIECE_TYPES, TOKENIZER_KINDS, Tokenizer,
                                 UnknownTokenError, build_tokenizer, tokenizer_from_state_dict)

log = logging.getLogger(__name__)


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
    max_duration: float = 200.0           # padded seconds per batch: batch size x longest utterance
    num_buckets: int = 10                 # duration buckets; a batch takes utterances of one bucket
    num_workers: int = 0                  # DataLoader workers (0 is fastest with precomputed features)
    max_train_utterances: Optional[int] = None  # use only the first N training cuts (quick runs)
    skip_bad_audio: bool = False          # false: missing/corrupt audio is an error listing every cut
    progress: bool = True                 # progress bars for feature computation


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
    return DataConfig(**cfg)


def feature_cache_folder(cfg: DataConfig) -> Path:
    """Where the features are cached: data.cache_dir, or by default {data.root}/features."""
    return Path(cfg.cache_dir) if cfg.cache_dir else Path(cfg.root) / "features"


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
    if cfg.max_train_utterances is not None and cfg.max_train_utterances < 1:
        raise ValueError(f"data.max_train_utterances={cfg.max_train_utterances} must be >= 1 or null")
    SpecAugment(cfg.freq_masks, cfg.freq_mask_width, cfg.time_masks, cfg.time_mask_width,
                cfg.time_mask_max_fraction)  # validates its own options
    if cfg.precompute_features and not can_write(feature_cache_folder(cfg)):
        if cfg.cache_dir:
            raise ValueError(f"data.cache_dir={cfg.cache_dir!r} is not writable; give a folder you can write to")
        raise ValueError(
            f"the feature cache {feature_cache_folder(cfg)} cannot be written (data.root={cfg.root!r} is read-only): "
            f"give a writable folder with data.cache_dir=FOLDER (features are computed once and reused from "
            f"there), or data.precompute_features=false to compute them per batch")


@dataclass
class SplitData:
    """One split, ready to batch: kept cuts, their token ids, where their features come from."""

    name: str
    cuts: CutSet
    targets: dict[str, dict[str, list[int]]]   # cut_id -> kind -> ids
    features: StoredFeatures | OnTheFlyFeatures | None = None
    dropped: dict[str, int] = field(default_factory=dict)   # reason -> count
    ctc_infeasible_kept: int = 0

    @property
    def hours(self) -> float:
        return sum(cut.duration for cut in self.cuts) / 3600.0


class SpeechDataModule(lightning.LightningDataModule):
    """Serves padded batches of fbank features and CTC targets from lhotse manifests.

    `frame_subsampling`: how many feature frames the encoder turns into one output frame (for the
    CTC feasibility filter). `seed`: sampler shuffling (epoch e uses seed + e, via `set_epoch`) and
    SpecAugment draws.
    """

    def __init__(self, cfg: DataConfig | Any, frame_subsampling: int = 1, seed: int = 0,
                 filterbank: FilterBank | None = None):
        super().__init__()
        self.cfg = as_data_config(cfg)
        validate_data_config(self.cfg)
        if frame_subsampling < 1:
            raise ValueError(f"frame_subsampling={frame_subsampling} must be >= 1")
        self.frame_subsampling = int(frame_subsampling)
        self.seed = int(seed)
        # filterbank: a trained model's front-end (SpeechRecognizer.frontend) when evaluating it
        self.filterbank = filterbank if filterbank is not None else FilterBank(self.cfg.num_mel_bins)
        if self.filterbank.num_mel_bins != self.cfg.num_mel_bins:
            raise ValueError(f"data.num_mel_bins={self.cfg.num_mel_bins}, but the front-end given computes "
                             f"{self.filterbank.num_mel_bins} bins")
        self._tokenizers: dict[str, Tokenizer] | None = None
        self._loaded: dict[str, SplitData] = {}      # after steps 1-3
        self._ready: dict[str, SplitData] = {}       # after steps 4-5
        self._stats: FeatureStats | None = None
        self._start_epoch = 0            # the first training epoch of this fit (restored from a checkpoint)
        self._train_sampler = None

    # ----- tokenizers -------------------------------------------------------------------------
    @property
    def tokenizers(self) -> dict[str, Tokenizer]:
        if self._tokenizers is None:
            raise RuntimeError("tokenizers are built in setup(); call setup() or set_tokenizers() first")
        return self._tokenizers

    def set_tokenizers(self, states: dict[str, dict]) -> None:
        """Use these tokenizers (state dicts, e.g. from a checkpoint) instead of building them."""
        if self._loaded:
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

    def _build_tokenizers(self, train_cuts: CutSet, phone_set: str) -> None:
        texts = [transcript(cut, "text") for cut in train_cuts]
        self._tokenizers = {kind: build_tokenizer(kind, texts, self.cfg.sentencepiece_vocab,
                                                  self.cfg.sentencepiece_type, phone_set)
                            for kind in self.cfg.targets}
        log.info("tokenizers built from %d training transcripts: %s", len(texts),
                 ", ".join(f"{k} ({t.vocab_size} classes)" for k, t in self._tokenizers.items()))

    # ----- features and statistics ------------------------------------------------------------
    @property
    def feature_dim(self) -> int:
        return self.cfg.num_mel_bins

    @property
    def feature_directory(self) -> Path:
        return feature_directory(feature_cache_folder(self.cfg), self.filterbank)

    @property
    def feature_stats(self) -> FeatureStats:
        """Mean/std over all frames of the kept training utterances (computed once, cached on disk)."""
        if self._stats is None:
            train = self._prepare(self.cfg.train_split)
            store = train.features.store if isinstance(train.features, StoredFeatures) else None
            stats, failures = global_feature_stats(
                list(train.cuts), self.filterbank, self.feature_directory / train.name, store,
                self.cfg.feature_jobs, self.cfg.progress)
            if failures:  # only in on-the-fly mode: audio corrupt past its header; stats exclude these
                self._apply_bad_audio_policy(train, failures)
            self._stats = stats
            log.info("feature statistics over %d training frames", stats.num_frames)
        return self._stats

    @property
    def feature_mean(self) -> torch.Tensor:
        return torch.tensor(self.feature_stats.mean, dtype=torch.float32)

    @property
    def feature_std(self) -> torch.Tensor:
        return torch.tensor(self.feature_stats.std, dtype=torch.float32)

    # ----- setup --------------------------------------------------------------------------------
    def _stage_splits(self, stage: str | None) -> list[str]:
        cfg = self.cfg
        if stage in (None, "fit"):
            return [cfg.train_split, cfg.dev_split]
        if stage == "validate":
            return [cfg.dev_split]
        if stage in ("test", "predict"):
            return [cfg.test_split]
        raise ValueError(f"unknown stage {stage!r}; expected fit, validate, test or predict")

    def setup(self, stage: str | None = None) -> None:
        splits = self._stage_splits(stage)
        for split in splits:           # steps 1-3 for all splits first: report bad input early
            self._load(split)
        for split in splits:           # then features and the CTC filter
            self._prepare(split)
        if stage in (None, "fit"):
            self.feature_stats  # noqa: B018 - SpecAugment and the model need it: compute it now

    def _is_train(self, split: str) -> bool:
        return split == self.cfg.train_split

    def _load(self, split: str) -> SplitData:
        """Steps 1-3: manifest, per-utterance problems, tokenizers and token ids."""
        if split in self._loaded:
            return self._loaded[split]
        cfg = self.cfg
        if self._tokenizers is None and not self._is_train(split):
            self._load(cfg.train_split)  # builds the tokenizers from the training text
        limit = cfg.max_train_utterances if self._is_train(split) else None
        cuts = load_cuts(cfg.root, cfg.corpus, split, need_phones="phones" in cfg.targets, limit=limit)
        fields = {"text"} | ({"phones"} if "phones" in cfg.targets else set())
        problems = UtteranceProblems()
        find_empty_transcripts(cuts, fields, problems)
        find_unusable_cuts(cuts, split, problems, cfg.max_duration, self.filterbank)   # asr.data.cut_checks
        data = SplitData(split, cuts, targets={})
        if problems.cut_ids("bad_audio"):
            self._apply_bad_audio_policy(data, problems.by_reason["bad_audio"])
        if problems.cut_ids("empty_transcript"):
            log.warning("%s: skipping %d utterances with an empty transcript: %s", split,
                        len(problems.cut_ids("empty_transcript")), problems.describe("empty_transcript"))
            self._drop(data, problems.cut_ids("empty_transcript"), "empty_transcript")
        phone_set = phone_set_of(data.cuts, split) if "phones" in cfg.targets else DEFAULT_PHONE_SET
        if self._tokenizers is None:
            self._build_tokenizers(data.cuts, phone_set)
        if "phones" in cfg.targets and self.tokenizers["phones"].phone_set != phone_set:
            raise ManifestError(f"{split}: the manifest's phones are {phone_set!r} but the phones tokenizer "
                                f"(from the training manifest or the checkpoint) is "
                                f"{self.tokenizers['phones'].phone_set!r}")
        data.targets = self._encode(split, data.cuts)
        self._loaded[split] = data
        return data

    def _drop(self, data: SplitData, cut_ids: set[str], reason: str) -> None:
        if not cut_ids:
            return
        data.cuts = data.cuts.filter(lambda cut: cut.id not in cut_ids).to_eager()
        for cut_id in cut_ids:
            data.targets.pop(cut_id, None)
        data.dropped[reason] = data.dropped.get(reason, 0) + len(cut_ids)
        if len(data.cuts) == 0:
            raise ManifestError(f"split {data.name!r} has no utterances left after dropping {len(cut_ids)} "
                                f"for {reason.replace('_', ' ')} (see the messages above)")

    def _apply_bad_audio_policy(self, data: SplitData, failures: dict[str, str]) -> None:
        described = listing(f"{cut_id}: {message}" for cut_id, message in failures.items())
        if not self.cfg.skip_bad_audio:
            raise ManifestError(
                f"{data.name}: {len(failures)} utterances have missing, unreadable or unusable audio: {described}. "
                "Regenerate or fix these files (for synth: rerun recipes.synth.prepare, which redoes what is "
                "missing), or set data.skip_bad_audio=true to leave them out. Features computed so far are kept.")
        log.warning("%s: skipping %d utterances with missing, unreadable or unusable audio (data.skip_bad_audio=true): %s",
                    data.name, len(failures), described)
        self._drop(data, set(failures), "bad_audio")

    def _encode(self, split: str, cuts: CutSet) -> dict[str, dict[str, list[int]]]:
        targets: dict[str, dict[str, list[int]]] = {}
        unknown: dict[tuple[str, str], list[str]] = defaultdict(list)   # (kind, symbol) -> cut ids
        advice: dict[str, str] = {}
        for cut in cuts:
            ids = {}
            for kind, tokenizer in self.tokenizers.items():
                try:
                    ids[kind] = tokenizer.encode(transcript(cut, tokenizer.field))
                except UnknownTokenError as error:
                    for symbol in error.tokens:
                        unknown[(kind, symbol)].append(cut.id)
                    advice.setdefault(kind, error.advice)
            targets[cut.id] = ids
        if unknown:
            lines = [f"  {kind} {symbol!r} in {len(ids)} utterances, e.g. {listing(ids, 3)}"
                     for (kind, symbol), ids in sorted(unknown.items())]
            raise ManifestError(f"{split}: transcripts hold symbols outside the tokenizers' tables:\n"
                                + "\n".join(lines) + "\n" + "\n".join(f"  {kind}: {text}" for kind, text in advice.items()))
        return targets

    def _prepare(self, split: str) -> SplitData:
        """Steps 4-5: features and the CTC feasibility filter."""
        if split in self._ready:
            return self._ready[split]
        data = self._load(split)
        cfg = self.cfg
        if cfg.precompute_features:
            store, failures = precompute_features(list(data.cuts), self.filterbank, self.feature_directory / split,
                                                  cfg.feature_jobs, cfg.progress, f"fbank {split}")
            if failures:
                self._apply_bad_audio_policy(data, failures)
            data.features = StoredFeatures(store)
        else:
            data.features = OnTheFlyFeatures(self.filterbank)

        infeasible, by_kind = set(), defaultdict(int)
        for cut in data.cuts:
            frames = data.features.num_frames(cut) // self.frame_subsampling
            for kind, ids in data.targets[cut.id].items():
                if ctc_min_frames(ids) > frames:
                    infeasible.add(cut.id)
                    by_kind[kind] += 1
        if infeasible:
            detail = (f"(frame_subsampling={self.frame_subsampling}; by target: "
                      f"{', '.join(f'{kind} {n}' for kind, n in by_kind.items())})")
            if len(infeasible) > 0.1 * len(data.cuts):
                detail += ("; that is many: the encoder's subsampling leaves too few frames for these targets, "
                           "consider a smaller model subsampling or other data.targets")
        if infeasible and self._is_train(split):
            log.warning("%s: dropping %d of %d utterances with more CTC targets than encoder frames %s: %s", split,
                        len(infeasible), len(data.cuts), detail, listing(sorted(infeasible)))
            self._drop(data, infeasible, "too_many_targets")
        elif infeasible:
            data.ctc_infeasible_kept = len(infeasible)
            log.warning("%s: %d of %d utterances have more CTC targets than encoder frames %s; kept for the "
                        "error rates, their CTC loss is infinite (use zero_infinity): %s", split, len(infeasible),
                        len(data.cuts), detail, listing(sorted(infeasible)))

        longest = max(data.cuts, key=lambda cut: cut.duration)
        if longest.duration > cfg.max_duration:
            raise ValueError(f"data.max_duration={cfg.max_duration} s is shorter than the longest {split} "
                             f"utterance ({longest.id}, {longest.duration:.2f} s); set data.max_duration to at "
                             f"least {longest.duration:.1f}")
        log.info("%s: %d utterances, %.2f h%s", split, len(data.cuts), data.hours,
                 f"; dropped {data.dropped}" if data.dropped else "")
        self._ready[split] = data
        return data

    def report(self) -> dict[str, dict]:
        """Per prepared split: utterances kept, hours, dropped by reason, CTC-infeasible kept."""
        return {name: {"utterances": len(d.cuts), "hours": d.hours, "dropped": dict(d.dropped),
                       "ctc_infeasible_kept": d.ctc_infeasible_kept} for name, d in self._ready.items()}

    # ----- loaders ------------------------------------------------------------------------------
    def sampler(self, split: str, train: bool):
        """Duration-bucketed batches of at most data.max_duration padded seconds (asr.data.batching).

        Deterministic from the seed and the epoch (Lightning calls `set_epoch`). Under DDP each rank
        gets its own share (`process_rank`), every utterance of a split exactly once over all ranks
        (the Trainer must use `use_distributed_sampler=False`, as asr.train does).
        """
        cuts = self._prepare(split).cuts
        rank, world_size = self.process_rank()
        return duration_bucketing_sampler(cuts, self.cfg.max_duration, self.cfg.num_buckets, shuffle=train,
                                          seed=self.seed, rank=rank, world_size=world_size)

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

    def dataset(self, split: str, train: bool) -> SpeechBatchDataset:
        data = self._prepare(split)
        specaugment = None
        if train and self.cfg.specaugment:
            cfg = self.cfg
            specaugment = SpecAugment(cfg.freq_masks, cfg.freq_mask_width, cfg.time_masks, cfg.time_mask_width,
                                      cfg.time_mask_max_fraction)
        fill = self.feature_mean if specaugment is not None else None
        return SpeechBatchDataset(data.targets, data.features, specaugment, fill, self.seed)

    def dataloader(self, split_name: str, train: bool = False) -> torch.utils.data.DataLoader:
        """Batches of any split; `train=True` shuffles and applies SpecAugment (if configured)."""
        workers = self.cfg.num_workers
        return torch.utils.data.DataLoader(
            self.dataset(split_name, train), sampler=self.sampler(split_name, train), batch_size=None,
            num_workers=workers, persistent_workers=workers > 0,
            # its own generator: making an iterator draws a seed, and from torch's global generator that
            # draw would shift dropout after a resume that makes one iterator more (asr.model.recognizer)
            generator=torch.Generator().manual_seed(self.seed))

    def train_dataloader(self):
        loader = self.dataloader(self.cfg.train_split, train=True)
        # Lightning creates the loader's iterator (and prefetches a batch) before its first set_epoch of
        # a fit, and lhotse fixes an epoch's order at iter(): a resumed run would replay epoch 0's
        # order. So the epoch to start with travels in the checkpoint (state_dict) and is set here.
        loader.sampler.set_epoch(self._start_epoch)
        self._train_sampler = loader.sampler
        return loader

    def state_dict(self) -> dict:
        """Saved in Lightning checkpoints: the training epoch a resumed run starts with."""
        sampler = self._train_sampler
        return {"next_train_epoch": sampler.next_epoch if sampler is not None else self._start_epoch}

    def load_state_dict(self, state_dict: dict) -> None:
        self._start_epoch = int(state_dict.get("next_train_epoch", 0))

    def val_dataloader(self):
        return self.dataloader(self.cfg.dev_split)

    def test_dataloader(self):
        return self.dataloader(self.cfg.test_split)

    def predict_dataloader(self):
        return self.dataloader(self.cfg.test_split)

"""The Lightning DataModule that serves batches, from a DataConfig (asr.data.config) and its corpus.

The config is checked where it was made (`DataConfig.of`, once per start) and the corpus resolved
by the caller (asr.train resolves it once and hands it over); neither is done again here.

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
6. build the sampler: duration-bucketed batches, this process's share
   (`duration_buckets.duration_bucketing_sampler`);
   with `data.join_seconds` the training split's batches are of long examples, consecutive
   utterances joined with a pause (`joined_examples.join_utterances`; step 5 joins their features).

Steps 1-4 run once per split and what they give is kept (`cut_checks.SplitData`); 5-6 are made for
each loader (they depend on `train`, this process's rank and the epoch). `setup(stage)` takes every
split of its stage through steps 1-3 before any split's features are computed, so bad input is
reported before minutes are spent; features already computed are kept on disk whatever fails later.

A corpus too large for this (data.streaming, by default from 50 MB of training manifest) takes the
streaming path instead: `split()` opens the split's shards, prepared once with steps 1-4 done
(asr.data.streaming.streamed_split), and step 6 is asr.data.batching.stream_sampler's sampler;
nothing per cut is kept in memory (asr/docs/data.md, "Large corpora").

The global mean/std (`feature_mean`, `feature_std`) are over all frames of the kept training
utterances, or of `feature_stats.STATS_SAMPLE_CUTS` of them evenly spread where the split has more;
they are computed on first use and cached next to the features.
"""

from __future__ import annotations

import logging
from functools import partial
from pathlib import Path

import lightning
import torch
from lhotse import CutSet

from asr.data.config import DataConfig, can_write
from asr.data.corpus.corpus import Corpus
from asr.core.corpus_lock import writing_corpus_folder
from asr.data.corpus.manifests import ManifestError, load_cuts
from asr.data.features.features import FilterBank
from asr.data.features.feature_cache import FeatureStore, StoredFeatures, attach_features, feature_directory
from asr.data.features.feature_stats import FeatureStats, global_feature_stats, statistics_sample
from asr.data.augment.specaugment import SpecAugment
from asr.data.augment.vtlp import VocalTractLengthPerturbation
from asr.data.augment.waveform_augmentation import (WaveformAugmenter, speed_factors, transforms_on_the_fly,
                                                    with_speed_copies)
from asr.data.splits.tokenizers import Tokenizer, build_tokenizers, check_transcripts, tokenizer_from_state_dict
from asr.data.splits.cut_checks import (SplitData, drop_bad_audio, drop_ctc_infeasible, drop_unusable_cuts,
                                        note_ctc_candidate)
from asr.data.streaming.stream_shards import stream_folder
from asr.data.streaming.streamed_split import (StreamedSplit, check_stream_transcripts, choose_streaming,
                                               open_streamed_split, stream_tokenizers)
from asr.data.batching.duration_buckets import EpochTaggedBucketingSampler, FixedBatchShapes, duration_bucketing_sampler
from asr.data.batching.joined_examples import join_utterances, pause_between
from asr.data.batching.stream_sampler import StreamingBucketSampler, plan_buckets
from asr.data.batching.dataset import SpeechBatchDataset

log = logging.getLogger(__name__)

# data.streaming=auto streams a corpus whose training manifest is larger (~500 h of lhotse cuts): from
# there the eager path's start-up and memory grow past what the streaming one needs (asr/RESULTS.md, "Scale")
AUTO_STREAMING_BYTES = 50 * 1024 ** 2


class SpeechDataModule(lightning.LightningDataModule):
    """Serves padded batches of fbank features and CTC targets from lhotse manifests.

    `frame_subsampling`: how many feature frames the encoder turns into one output frame (for the
    CTC feasibility filter). `seed`: sampler shuffling (epoch e uses seed + e, via `set_epoch`) and
    SpecAugment draws. `cache_lock`: a context manager factory held by one process at a time while it
    writes the feature cache (features, statistics, streaming shards); by default the cache folder's
    lock (asr.core.corpus_lock), which every process on the corpus meets - other runs, the
    processes of one run. Reading needs no lock (feature_cache.precompute_features).
    """

    def __init__(self, cfg: DataConfig, frame_subsampling: int = 1, seed: int = 0,
                 filterbank: FilterBank | None = None, cache_lock=None, corpus: Corpus | None = None):
        super().__init__()
        if not isinstance(cfg, DataConfig):   # checked where it was made (DataConfig.of), never again here
            raise TypeError(f"SpeechDataModule takes a DataConfig (DataConfig.of(section)), got {type(cfg).__name__}")
        self.cfg = cfg
        # data.corpus and data.root: the corpus the caller resolved (asr.train's one), or resolved here
        self.corpus = corpus if corpus is not None else Corpus.of(cfg)
        if frame_subsampling < 1:
            raise ValueError(f"frame_subsampling={frame_subsampling} must be >= 1")
        self.frame_subsampling = int(frame_subsampling)
        self.seed = int(seed)
        self.cache_lock = cache_lock if cache_lock is not None else partial(
            writing_corpus_folder, cfg.feature_cache_folder, f"writing the feature cache of {cfg.corpus}")
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
        self._batches_done = 0   # the batches a resumed (not streamed) epoch had trained (state_dict)

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
            self._check_cache_holds(name, data.cuts)
            # 4. attach features; leave out audio found corrupt there, and what CTC cannot align
            data.features, failures = attach_features(data.cuts, self.filterbank, cfg.precompute_features,
                                                      cfg.feature_cache_folder, name, cfg.feature_jobs, cfg.progress,
                                                      self.cache_lock)
            drop_bad_audio(data, failures, cfg.skip_bad_audio)
            drop_ctc_infeasible(data, self.frame_subsampling, is_train=name == cfg.train_split)
            log.info("%s %s: %d utterances, %.2f h%s", cfg.corpus, name, len(data.cuts), data.hours,
                     f"; dropped {data.dropped}" if data.dropped else "")
        return data

    def _check_cache_holds(self, name: str, cuts) -> None:
        """ManifestError, before any feature is computed, when split `name` has cuts without cached
        features and the cache cannot be written (a read-only corpus: DataConfig.check_feature_cache)."""
        cfg = self.cfg
        if not cfg.precompute_features or can_write(cfg.feature_cache_folder):
            return
        directory = cfg.feature_cache_folder / self.filterbank.cache_key / name
        store = FeatureStore(directory, self.filterbank.num_mel_bins) if directory.is_dir() else None
        missing = sum(1 for cut in cuts if store is None or not store.has(cut))
        if missing:
            raise ManifestError(cfg.feature_cache_error(f"the features of {missing} utterances of split {name!r}"))

    @property
    def streaming(self) -> bool:
        """Whether the splits are read from streaming shards (data.streaming; auto: see DataConfig)."""
        if self._streaming is None:
            train = self.cfg.train_split
            self._streaming = choose_streaming(self.cfg, self.corpus.cuts_path(train),
                                               stream_folder(self.feature_directory / train), AUTO_STREAMING_BYTES)
        return self._streaming

    def _streamed_split(self, name: str) -> StreamedSplit:
        """A split from its streaming shards, prepared now if they are missing (asr.data.streaming.streamed_split)."""
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
        # a streamed training split finds the utterances CTC cannot align per batch (asr.data.streaming.streamed_split)
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
        every process and in every epoch of the run (asr.data.batching.joined_examples)."""
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
        return feature_directory(self.cfg.feature_cache_folder, self.filterbank)

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
        elif self._batches_done and isinstance(loader.sampler, EpochTaggedBucketingSampler):
            loader.sampler.skip_next(self._batches_done)      # mid-epoch: the epoch goes on, not anew
        self._train_sampler = loader.sampler
        return loader

    def state_dict(self) -> dict:
        """Saved in Lightning checkpoints: the training epoch a resumed run starts with, and the
        position in it: for a streamed split as asr.data.batching.stream_sampler keeps it (the same
        on every process), otherwise the batches this epoch has trained (a checkpoint written inside
        an epoch: trainer.checkpoint_every_n_steps, a SIGTERM's)."""
        sampler = self._train_sampler
        # the steps trained, not the batches drawn: the loader draws ahead of training
        trainer = getattr(self, "trainer", None)
        steps = trainer.fit_loop.epoch_loop.batch_progress.current.processed if trainer is not None else 0
        if isinstance(sampler, StreamingBucketSampler):
            position = sampler.position_after(steps)
            return {"next_train_epoch": sampler.epoch if position is not None else sampler.epoch + 1,
                    "stream_position": position}
        if sampler is None:
            return {"next_train_epoch": self._start_epoch}
        done = steps if sampler.next_epoch == sampler.iteration_epoch else 0   # an exhausted epoch is done
        return {"next_train_epoch": sampler.next_epoch, "epoch_batches_done": done}

    def load_state_dict(self, state_dict: dict) -> None:
        self._start_epoch = int(state_dict.get("next_train_epoch", 0))
        self._stream_position = state_dict.get("stream_position")
        self._batches_done = int(state_dict.get("epoch_batches_done", 0))   # absent in older checkpoints

    def val_dataloader(self):
        return self.dataloader(self.cfg.dev_split)

    def test_dataloader(self):
        return self.dataloader(self.cfg.test_split)

    def predict_dataloader(self):
        return self.dataloader(self.cfg.test_split)

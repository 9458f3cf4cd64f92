"""Batches by duration: lhotse's DynamicBucketingSampler with a hard cap on padded duration.

This module uses lhotse's private sampler internals (`_next_batch`, `allow_iter_to_reset_state`,
TimeConstraint's fields), so pyproject.toml pins lhotse to the minor version tested (1.33);
tests/asr/data/test_ddp_sharding.py is the guard when raising the pin.

`max_duration` bounds the padded audio of a batch, `len(batch) * longest utterance <= max_duration`
(hence also the sum of durations), strictly. lhotse's own TimeConstraint measures the same thing
but decides whether to take one more utterance by assuming it is no longer than the longest one
already in the batch; when it is longer, the batch overshoots (measured: 3 x 8.53 s in a 25 s
batch). `BucketBoundedDuration` assumes instead the longest duration the batch's bucket can hold -
every batch is drawn from one bucket - so the cap holds whatever comes next, at the price of a
slightly smaller batch now and then.

Epochs are deterministic: shuffling uses seed + epoch (`set_epoch`), and lhotse's bucket
synchronisation (on by default) makes the sequence of buckets the same in every epoch, which keeps
DDP ranks in step. (lhotse 1.33 with sync_buckets=False loses utterances at the end of an epoch,
measured 31 of 40, so it is left on.)

Several processes (DDP): every rank builds the same sequence of batches and takes every
world_size-th one (its rank's), so ranks see disjoint utterances and the same number of batches
(DDP needs each rank to take every step). The last round of an epoch may hold fewer batches than
ranks; its batches are then split (never merged: a piece of a batch keeps the duration cap) so that
every rank gets one, and a rank left without any utterance (fewer utterances than ranks) gets a
*padding* batch - one utterance of the round, flagged `padding=True` - that the model runs but
neither counts nor learns from. lhotse's own sampler instead fills such a round with duplicated
utterances (ids `<id>_dup0`) that would be scored twice and have no targets, and its merged last
round can break the duration cap.

Fixed shapes (`data.fixed_batch_shapes`, what `trainer.cuda_graphs` needs: a CUDA graph replays one
shape): every batch of bucket i is padded to (rows_i, frames_i), rows_i = floor(max_duration /
bound_i) - the most utterances BucketBoundedDuration lets into a batch of that bucket - and frames_i
the frames of an utterance of the bucket's upper bound, rounded up to a multiple of 8
(`FixedBatchShapes`). So training sees at most `num_buckets` shapes. The padded rows are one frame
long and carry no utterance: the model drops them before the loss (asr.model.recognizer).
"""

from __future__ import annotations

from bisect import bisect_left
import math
import warnings
from dataclasses import dataclass, field
from typing import NamedTuple

import torch
from lhotse import CutSet
from lhotse.dataset import DynamicBucketingSampler
from lhotse.dataset.sampling.base import TimeConstraint
from lhotse.dataset.sampling.dynamic_bucketing import estimate_duration_buckets


@dataclass
class BucketBoundedDuration(TimeConstraint):
    """TimeConstraint whose look-ahead uses the upper duration bound of the batch's bucket."""

    bucket_upper_bounds: list = field(default_factory=list)  # bucket i holds durations <= bounds[i]

    def _bucket_upper_bound(self) -> float:
        # the bucket of the batch, found as lhotse's select_bucket does (bisect_left on the boundaries)
        return self.bucket_upper_bounds[bisect_left(self.bucket_upper_bounds[:-1], self.longest_seen)]

    def close_to_exceeding(self) -> bool:
        return (self.num_cuts + 1) * self._bucket_upper_bound() > self.max_duration

    def load_state_dict(self, state_dict: dict) -> None:
        state_dict = dict(state_dict)
        self.bucket_upper_bounds = list(state_dict.pop("bucket_upper_bounds", self.bucket_upper_bounds))
        super().load_state_dict(state_dict)


class EpochBatch(NamedTuple):
    """What the sampler yields: the cuts of one batch and the epoch they belong to. The epoch lets
    the dataset seed SpecAugment by (seed, epoch, cut ids), which a resumed run reproduces.
    `padding`: a stand-in batch for a rank that has no utterance left in an epoch's last round
    (see the module doc); the model runs it to keep the ranks in step but does not count it."""

    epoch: int
    cuts: CutSet
    padding: bool = False
    shape: tuple[int, int] | None = None   # (rows, frames) to pad the batch to (FixedBatchShapes), or None


@dataclass(frozen=True)
class FixedBatchShapes:
    """The padded shape (rows, frames) of each bucket's batches (the module doc)."""

    bucket_upper_bounds: tuple[float, ...]   # seconds; bucket i holds durations <= bounds[i]
    max_duration: float
    frames_per_second: float                 # feature frames per second of audio (100 for a 10 ms shift)
    frame_multiple: int = 8

    def bucket_shape(self, bucket: int) -> tuple[int, int]:
        bound = self.bucket_upper_bounds[bucket]
        rows = max(1, math.floor(self.max_duration / bound))
        frames = math.ceil(bound * self.frames_per_second)
        return rows, -(-frames // self.frame_multiple) * self.frame_multiple

    @property
    def shapes(self) -> list[tuple[int, int]]:
        return [self.bucket_shape(i) for i in range(len(self.bucket_upper_bounds))]

    def shape_of(self, durations: list[float]) -> tuple[int, int]:
        """The shape of a batch with these durations: its bucket's, found from its longest utterance as
        BucketBoundedDuration and lhotse find a batch's bucket (every batch is drawn from one bucket)."""
        bucket = bisect_left(self.bucket_upper_bounds[:-1], max(durations))
        rows, frames = self.bucket_shape(bucket)
        return max(rows, len(durations)), frames


def pad_to_shape(features: torch.Tensor, lengths: torch.Tensor, shape: tuple[int, int]
                 ) -> tuple[torch.Tensor, torch.Tensor]:
    """(B, T, F) features and (B,) lengths padded to (rows, frames, F) and (rows,): zeros past every
    length, the added rows one frame long (a length every attention and the front end take as it
    is). A batch longer than `frames` keeps its length (it then has a shape of its own)."""
    rows, frames = shape
    batch, time, bins = features.shape
    padded = features.new_zeros(max(rows, batch), max(frames, time), bins)
    padded[:batch, :time] = features
    return padded, torch.cat([lengths, lengths.new_ones(padded.shape[0] - batch)])


def share_last_round(batches: list[CutSet], world_size: int) -> list[tuple[CutSet, bool]]:
    """An epoch's last round, `batches` (fewer than `world_size`), as exactly `world_size`
    (cuts, padding) pairs, the same on every rank: the largest piece is halved until there is one
    per rank or every piece is a single utterance, so each piece is part of one batch and keeps its
    duration cap; ranks still without a piece get a padding copy of the round's first utterance."""
    pieces = [list(batch) for batch in batches]
    while len(pieces) < world_size and max(len(piece) for piece in pieces) > 1:
        largest = max(range(len(pieces)), key=lambda i: len(pieces[i]))   # the first of the largest
        piece = pieces[largest]
        pieces[largest:largest + 1] = [piece[:(len(piece) + 1) // 2], piece[(len(piece) + 1) // 2:]]
    shared = [(CutSet.from_cuts(piece), False) for piece in pieces]
    stand_in = CutSet.from_cuts(pieces[0][:1])
    return shared + [(stand_in, True)] * (world_size - len(shared))


class EpochTaggedBucketingSampler(DynamicBucketingSampler):
    """A DynamicBucketingSampler that yields EpochBatch instead of CutSet, gives each rank its share
    of the batches (module doc), and knows which epoch comes next (`next_epoch`: the current one, or
    the one after it once this one is exhausted).

    lhotse fixes an epoch's order when `iter()` is called, so `set_epoch` must come before the
    DataLoader creates its iterator; SpeechDataModule takes care of that when a run resumes. A
    `set_epoch` during an iteration (Lightning's, after resuming from a checkpoint written when a
    trainer.max_steps run stopped inside an epoch: it counts that epoch as done) is for the next
    one: the batches of this iteration say the epoch whose order they follow.
    """

    _exhausted = False
    _iteration_epoch: int | None = None   # the epoch of the running iteration (its order, its batches' tag)
    _skip_rounds = 0      # rounds of batches the next iteration leaves out (skip_next)
    fixed_shapes: FixedBatchShapes | None = None   # set: every batch says its padded shape (module doc)

    def skip_next(self, batches: int) -> None:
        """The next iteration starts after its first `batches` batches of this rank (each a round of
        all ranks'): a run resumed inside an epoch goes on with the batches it had not trained."""
        self._skip_rounds = batches

    def __iter__(self):
        self._exhausted = False
        self._iteration_epoch = self.epoch
        iterator = super().__iter__()
        skip, self._skip_rounds = self._skip_rounds, 0
        for _ in range(skip):   # drawn as the interrupted run drew them, so the rest follows alike
            try:
                next(self)
            except StopIteration:
                break
        return iterator

    def __next__(self) -> EpochBatch:
        # lhotse's CutSampler.__next__ is replaced (see the module doc); _next_batch is the batch
        # sequence every rank builds alike (its bucketer picks each bucket world_size times in a row).
        self.allow_iter_to_reset_state()
        round_batches = []
        for _ in range(self.world_size):
            try:
                round_batches.append(self._next_batch())
            except StopIteration:
                break
        if not round_batches:
            self._exhausted = True
            raise StopIteration
        if len(round_batches) == self.world_size:
            cuts, padding = round_batches[self.rank], False
        else:
            cuts, padding = share_last_round(round_batches, self.world_size)[self.rank]
        shape = None if self.fixed_shapes is None else self.fixed_shapes.shape_of([c.duration for c in cuts])
        return EpochBatch(self._iteration_epoch, cuts, padding, shape)

    @property
    def iteration_epoch(self) -> int:
        """The epoch being drawn (the last one drawn once exhausted; before any: the epoch set)."""
        return self.epoch if self._iteration_epoch is None else self._iteration_epoch

    @property
    def next_epoch(self) -> int:
        return self.iteration_epoch + 1 if self._exhausted else self.iteration_epoch

    def estimated_batches(self) -> int:
        """The batches this rank gets in one epoch, from the cut durations alone (the sampler has no
        length: Lightning's bar would show `k/?`). Every batch comes from one bucket and holds
        floor(max_duration / the bucket's upper bound) cuts (BucketBoundedDuration), except the
        bucket's last one; the ranks share that sequence, every rank one batch per round. It matched
        the batches actually drawn in every case tested; lhotse's buffering could in principle end a
        batch early, so it is an estimate."""
        if getattr(self, "_estimated_batches", None) is None:
            bounds = self.constraint.bucket_upper_bounds
            per_bucket = [0] * len(bounds)
            for cuts in self.cuts:
                for cut in cuts:   # bucket as BucketBoundedDuration and lhotse find it
                    per_bucket[bisect_left(bounds[:-1], cut.duration)] += 1
            batches = sum(math.ceil(count / max(1, math.floor(self.constraint.max_duration / bound)))
                          for count, bound in zip(per_bucket, bounds) if count)
            self._estimated_batches = math.ceil(batches / self.world_size)
        return self._estimated_batches


def duration_bucketing_sampler(cuts: CutSet, max_duration: float, num_buckets: int, shuffle: bool,
                               seed: int, rank: int = 0, world_size: int = 1,
                               fixed_shapes_frames_per_second: float | None = None) -> EpochTaggedBucketingSampler:
    """Batches of at most `max_duration` padded seconds, from `num_buckets` duration buckets whose
    boundaries are estimated over all of `cuts` (each bucket holds about the same total duration);
    the share of process `rank` out of `world_size` (given explicitly, never guessed from the
    environment). `fixed_shapes_frames_per_second`: the features' frame rate, to give every batch
    its bucket's fixed shape (FixedBatchShapes); None: no fixed shapes."""
    if not 0 <= rank < world_size:
        raise ValueError(f"rank={rank} must lie in [0, world_size={world_size})")
    longest = max(cut.duration for cut in cuts)
    if longest > max_duration:
        raise ValueError(f"max_duration={max_duration} s cannot hold the utterance of {longest:.2f} s")
    num_buckets = min(num_buckets, len(cuts))
    bins = estimate_duration_buckets(cuts, num_buckets) if num_buckets > 1 else []
    # A boundary above every cut (the last bucket's bound); also makes a lone bucket explicit for lhotse.
    bins = sorted(set(bins)) + [longest + 1e-3]
    constraint = BucketBoundedDuration(max_duration=max_duration, bucket_upper_bounds=bins)
    with warnings.catch_warnings():
        # lhotse suggests lazy manifests for memory; ours are filtered in memory on purpose.
        warnings.filterwarnings("ignore", message=".*eagerly read CutSet.*")
        sampler = EpochTaggedBucketingSampler(cuts, constraint=constraint, duration_bins=bins[:-1] or bins,
                                              shuffle=shuffle, drop_last=False, seed=seed,
                                              rank=rank, world_size=world_size)
    if fixed_shapes_frames_per_second is not None:
        sampler.fixed_shapes = FixedBatchShapes(tuple(bins), max_duration, fixed_shapes_frames_per_second)
    return sampler

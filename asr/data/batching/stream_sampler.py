"""Batches of a streamed split (asr.data.streaming.stream_shards): duration buckets over windows of shards,
each process reading only its own windows, with a position that resumes mid-epoch exactly.

**Buckets** (`plan_buckets`) are chosen at start-up from the split's duration histogram (the index,
0.1 s bins), each holding about the same total duration as lhotse's estimate_duration_buckets does
over the cuts; bucket i holds durations up to bound_i, the top of its last bin, and a batch of it
holds rows_i = floor(data.max_duration / bound_i) utterances (the duration cap of
asr.data.batching.duration_buckets's BucketBoundedDuration, strictly).

**An epoch** (`epoch_plan`): the shards in an order drawn from (seed, epoch), cut into *windows* of
`window_shards` consecutive shards. A window's batches: its cuts read, shuffled with (seed, epoch,
window), put in their buckets, each bucket cut into batches of rows_i, the batches shuffled. So a
window has exactly sum_i ceil(n_i / rows_i) batches, known from the histograms alone (n_i: the
window's cuts in bucket i), and the same batches whatever the number of processes. The memory
held is one window's cuts (8 shards of 1,000 cuts: ~8 MB), whatever the corpus's size. The price
of windows: up to one partly filled batch per bucket per window, 0.3 % more batches than bucketing
the whole split at once (the synth corpus's durations scaled to 100-10,000 h, data.max_duration=60,
10 buckets, 8 shards of 1,000 cuts a window). Without shuffling (dev, test) the shards and batches
keep their order.

**Processes** (DDP): the windows not yet finished are dealt out in turn, process r taking the r-th,
(r + world_size)-th, ... of them; every process reads only its windows' shards. All take the same
number of steps, the largest share's: a process that runs out first takes *padding* batches (one
utterance of its last batch, `padding=True`, as in asr.data.batching.duration_buckets) that the model runs but
neither counts nor learns from. So an epoch covers every utterance exactly once; the cost is the
padding steps, at most one window's batches per process per epoch.

**Resuming** (`position_after`, `resume_at`): the position in an epoch is, per window, how many of
its batches are done. It follows from the steps trained since the epoch (or its last resume)
began: every process takes one batch per step, in a known order, so any process computes every
process's progress without talking to them, and the checkpoint written by rank 0 holds the whole
position. A resumed epoch deals the windows with batches left - on any number of processes - and
each goes on from its first batch not done: every batch of the epoch exactly once, also after a
change of process count.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from asr.data.batching.duration_buckets import EpochBatch, FixedBatchShapes
from asr.data.corpus.manifests import StreamCut
from asr.data.streaming.stream_shards import StreamIndex, duration_bin


@dataclass(frozen=True)
class StreamBuckets:
    """The buckets of a streamed split for one data.max_duration and data.num_buckets."""

    bin_bucket: np.ndarray        # histogram bin -> bucket
    bounds: tuple[float, ...]     # bucket i holds durations <= bounds[i]
    rows: tuple[int, ...]         # utterances per batch of bucket i
    shard_counts: np.ndarray      # (shards, buckets) cuts per shard and bucket

    def bucket_of(self, cut: StreamCut) -> int:
        return int(self.bin_bucket[min(duration_bin(cut.duration), len(self.bin_bucket) - 1)])


def plan_buckets(index: StreamIndex, num_buckets: int, max_duration: float) -> StreamBuckets:
    """Buckets of about equal total duration from the split's histogram (module doc); ValueError
    naming data.max_duration when the longest utterances cannot fit a batch."""
    grid = index.index["grid"]
    counts = index.total_histogram()
    bins = len(counts)
    weight = np.cumsum(counts * (np.arange(1, bins + 1) * grid))
    targets = weight[-1] * np.arange(1, num_buckets) / num_buckets
    last_bins = sorted({int(b) for b in np.searchsorted(weight, targets, side="left")} | {bins - 1})
    last_bins = [b for b in last_bins if b < bins]
    bounds = tuple(round((b + 1) * grid, 6) for b in last_bins)
    rows = tuple(math.floor(max_duration / bound + 1e-9) for bound in bounds)
    if rows[-1] < 1:
        raise ValueError(f"data.max_duration={max_duration} s cannot hold the split's longest utterances "
                         f"(up to {bounds[-1]:.1f} s, in {index.folder}): raise data.max_duration")
    bin_bucket = np.searchsorted(np.asarray(last_bins), np.arange(bins), side="left")
    one_hot = np.eye(len(bounds), dtype=np.int32)[bin_bucket]
    shard_counts = np.concatenate([rows_chunk.astype(np.int32) @ one_hot for rows_chunk in index.histogram_rows()])
    return StreamBuckets(bin_bucket, bounds, rows, shard_counts)


class StreamingBucketSampler:
    """Yields EpochBatch (cuts: a list of StreamCut) for process `rank` of `world_size` (module doc)."""

    def __init__(self, index: StreamIndex, buckets: StreamBuckets, shuffle: bool, seed: int, rank: int = 0,
                 world_size: int = 1, window_shards: int = 8, fixed_shapes: FixedBatchShapes | None = None):
        if not 0 <= rank < world_size:
            raise ValueError(f"rank={rank} must lie in [0, world_size={world_size})")
        if window_shards < 1:
            raise ValueError(f"data.stream_window_shards={window_shards} must be >= 1")
        self.index, self.buckets, self.shuffle, self.seed = index, buckets, shuffle, seed
        self.rank, self.world_size, self.window_shards = rank, world_size, window_shards
        self.fixed_shapes = fixed_shapes
        self.epoch = 0
        self._start_consumed: np.ndarray | None = None   # per window, batches done when this epoch (re)started
        self._start_steps = 0                            # steps the epoch had trained then
        self._plan: tuple[int, list, np.ndarray] | None = None
        self._exhausted = False
        self._drawing = False                            # an iteration has begun and not finished
        self._deferred_epoch: int | None = None          # set_epoch while drawing (set_epoch's doc)

    # ----- the epoch's plan -------------------------------------------------------------------------
    def set_epoch(self, epoch: int) -> None:
        """The epoch the next iteration draws. Called while an epoch is being drawn (Lightning does,
        after resuming from a checkpoint written when a trainer.max_steps run stopped inside an
        epoch: it counts that epoch as done), it waits for the next iteration, and the running
        epoch goes on with its own order and position."""
        if self._drawing:
            self._deferred_epoch = int(epoch)
            return
        self._deferred_epoch = None
        if epoch != self.epoch or self._start_consumed is None:
            self.epoch, self._start_consumed, self._start_steps = int(epoch), None, 0

    def resume_at(self, position: dict) -> None:
        """Go on from `position` (what `position_after` gave; the same world size or another)."""
        windows, counts = self.epoch_plan(position["epoch"])
        consumed = np.asarray(position["consumed"], dtype=np.int64)
        if consumed.shape != counts.shape or np.any(consumed > counts):
            raise ValueError(f"the checkpoint's stream position does not fit the split in {self.index.folder} "
                             f"({len(consumed)} windows saved, {len(counts)} now): was the split prepared again "
                             "or data.max_duration, data.num_buckets or data.stream_window_shards changed? "
                             "Resume with the run's data options, or start the epoch anew")
        self.epoch, self._start_consumed, self._start_steps = int(position["epoch"]), consumed, int(position["steps"])

    def epoch_plan(self, epoch: int) -> tuple[list[np.ndarray], np.ndarray]:
        """(windows: the shards of each, batches per window) of `epoch`."""
        if self._plan is None or self._plan[0] != epoch:
            shards = self.index.shards
            order = np.random.default_rng((self.seed, epoch)).permutation(shards) if self.shuffle else np.arange(shards)
            windows = [order[i:i + self.window_shards] for i in range(0, shards, self.window_shards)]
            # cuts per window and bucket: sums of the window's shards' rows (int32: 45,700 shards at 100,000 h)
            cuts = np.add.reduceat(self.buckets.shard_counts[order], np.arange(0, shards, self.window_shards), axis=0)
            rows = np.asarray(self.buckets.rows, dtype=np.int32)
            self._plan = (epoch, windows, (-(-cuts // rows)).sum(axis=1, dtype=np.int64))
        return self._plan[1], self._plan[2]

    def _consumed(self, counts: np.ndarray) -> np.ndarray:
        return np.zeros_like(counts) if self._start_consumed is None else self._start_consumed

    def shares(self, consumed: np.ndarray, counts: np.ndarray) -> list[np.ndarray]:
        """The windows with batches left, dealt to the processes in turn."""
        left = np.flatnonzero(consumed < counts)
        return [left[rank::self.world_size] for rank in range(self.world_size)]

    def estimated_batches(self) -> int:
        """The steps this (re)started epoch takes on every process (exact: from the histograms)."""
        _, counts = self.epoch_plan(self.epoch)
        consumed = self._consumed(counts)
        return max((int((counts[share] - consumed[share]).sum()) for share in self.shares(consumed, counts)), default=0)

    def position_after(self, steps: int) -> dict | None:
        """The position once the epoch has trained `steps` batches on every process (counted from the
        epoch's start, resumes included), or None when the epoch is done."""
        _, counts = self.epoch_plan(self.epoch)
        consumed = self._consumed(counts).copy()
        advance = steps - self._start_steps
        for share in self.shares(self._consumed(counts), counts):
            left = advance
            for window in share:
                take = min(left, int(counts[window] - consumed[window]))
                consumed[window] += take
                left -= take
                if left == 0:
                    break
        if np.all(consumed >= counts):
            return None
        return {"epoch": self.epoch, "consumed": consumed.tolist(), "steps": int(steps)}

    @property
    def next_epoch(self) -> int:
        return self.epoch + 1 if self._exhausted else self.epoch

    # ----- batches ----------------------------------------------------------------------------------
    def window_batches(self, window: int, shards: np.ndarray) -> list[tuple[int, list[StreamCut]]]:
        """(bucket, cuts) of every batch of `window` in this epoch, in order (module doc)."""
        cuts = [cut for shard in shards for cut in self.index.cuts_of(int(shard))]
        rng = np.random.default_rng((self.seed, self.epoch, window))
        if self.shuffle:
            cuts = [cuts[i] for i in rng.permutation(len(cuts))]
        by_bucket: list[list[StreamCut]] = [[] for _ in self.buckets.bounds]
        for cut in cuts:
            by_bucket[self.buckets.bucket_of(cut)].append(cut)
        batches = [(bucket, members[i:i + self.buckets.rows[bucket]])
                   for bucket, members in enumerate(by_bucket) for i in range(0, len(members), self.buckets.rows[bucket])]
        if self.shuffle:
            batches = [batches[i] for i in rng.permutation(len(batches))]
        return batches

    def _batch(self, bucket: int, cuts: list[StreamCut], padding: bool = False) -> EpochBatch:
        shape = None
        if self.fixed_shapes is not None:
            rows, frames = self.fixed_shapes.bucket_shape(bucket)
            shape = (max(rows, len(cuts)), frames)
        return EpochBatch(self.epoch, cuts, padding, shape)

    def __iter__(self):
        if self._drawing:   # the last iteration was left unfinished (a step budget reached mid-epoch)
            self._drawing = False
            if self._deferred_epoch is not None:
                self.set_epoch(self._deferred_epoch)
        self._drawing, self._exhausted = True, False
        windows, counts = self.epoch_plan(self.epoch)
        consumed = self._consumed(counts)
        shares = self.shares(consumed, counts)
        steps = max((int((counts[share] - consumed[share]).sum()) for share in shares), default=0)
        taken, last = 0, None
        for window in shares[self.rank]:
            batches = self.window_batches(int(window), windows[window])
            if len(batches) != counts[window]:
                raise RuntimeError(f"{self.index.folder}: window {window} holds {len(batches)} batches where its "
                                   f"histograms say {counts[window]}: the split's shards changed after its index was "
                                   "written; prepare it again (python -m asr.prepare_shards)")
            for bucket, cuts in batches[consumed[window]:]:
                yield self._batch(bucket, cuts)
                taken, last = taken + 1, (bucket, cuts[:1])
        if taken < steps and last is None:   # nothing left for this process: stand in with any utterance
            first = self.index.cuts_of(int(windows[0][0]))[:1]
            last = (self.buckets.bucket_of(first[0]), first)
        for _ in range(steps - taken):
            yield self._batch(*last, padding=True)
        self._drawing, self._exhausted = False, True

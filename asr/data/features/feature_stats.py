"""The global mean/variance statistics of the training features: per filter-bank dimension, over the
frames of `statistics_sample` of the training split, cached as `{split}/stats-<hash>.json` beside the
split's features (asr.data.features.feature_cache) for that exact set of cuts.
"""

from __future__ import annotations

import errno
import hashlib
import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from asr.data.features.feature_cache import SHARD_CUTS, FeatureStore, audio_fingerprint, run_chunks, write_atomic
from asr.data.features.features import FilterBank

# Standard deviations below this are raised to it, so normalising a constant dimension cannot divide by 0.
STD_FLOOR = 1e-5


@dataclass
class FeatureStats:
    """Per-dimension mean and standard deviation over all frames of a set of utterances."""

    mean: np.ndarray
    std: np.ndarray
    num_frames: int

    @staticmethod
    def from_sums(total: np.ndarray, total_sq: np.ndarray, count: int) -> "FeatureStats":
        if count == 0:
            raise ValueError("no feature frames to compute mean/variance statistics from")
        mean = total / count
        variance = np.maximum(total_sq / count - mean ** 2, 0.0)
        return FeatureStats(mean, np.maximum(np.sqrt(variance), STD_FLOOR), int(count))

    def to_json(self) -> str:
        return json.dumps({"mean": self.mean.tolist(), "std": self.std.tolist(), "num_frames": self.num_frames})

    @staticmethod
    def from_json(text: str) -> "FeatureStats":
        data = json.loads(text)
        return FeatureStats(np.asarray(data["mean"]), np.asarray(data["std"]), int(data["num_frames"]))


# The statistics are over the frames of at most this many training utterances, evenly spread over the
# split: the mean/std of 5,000 utterances (~10 h, millions of frames) differ from those of all frames by
# far less than the features' own spread, and at 1,000 h reading every frame took minutes (asr/RESULTS.md,
# "Scale"). A split of at most this many utterances (the demo's 3,000) uses every frame, as before.
STATS_SAMPLE_CUTS = 5000


def statistics_sample(cuts, size: int | None = None) -> list:
    """Every cut when there are at most `size` (default STATS_SAMPLE_CUTS); otherwise `size` cuts evenly
    spaced over `cuts` (deterministic: the same split gives the same sample, so the cached statistics
    are found again)."""
    size = STATS_SAMPLE_CUTS if size is None else size
    cuts = list(cuts)
    if len(cuts) <= size:
        return cuts
    return [cuts[i * len(cuts) // size] for i in range(size)]


def _stats_file(directory: Path, cuts) -> Path:
    digest = hashlib.sha1("\n".join(f"{c.id} {audio_fingerprint(c)}" for c in cuts).encode()).hexdigest()[:16]
    return Path(directory) / f"stats-{digest}.json"


def global_feature_stats(cuts, filterbank: FilterBank, directory: Path, store: FeatureStore | None = None,
                         jobs: int = 1, progress: bool = True, lock=None) -> tuple[FeatureStats, dict[str, str]]:
    """Mean/std over every frame of `cuts` (the caller passes `statistics_sample` of a large split),
    cached in `directory` for this exact set of cuts.

    With a `store` the frames are read from it; without one they are computed from the audio (the
    on-the-fly mode) and only the statistics are kept. Returns (stats, failures {cut_id: message}):
    cuts whose audio cannot be read count as failures, and the statistics are then over the others
    (and not cached). `lock`: as in precompute_features, taken only when the statistics are not cached.
    """
    stats_file = _stats_file(directory, cuts)
    if stats_file.is_file():
        return FeatureStats.from_json(stats_file.read_text()), {}
    if lock is not None:
        with lock():
            return global_feature_stats(cuts, filterbank, directory, store, jobs, progress)
    failures: dict[str, str] = {}
    total = np.zeros(filterbank.num_mel_bins)
    total_sq = np.zeros(filterbank.num_mel_bins)
    count = 0
    if store is not None:
        for cut in cuts:
            frames = store.load(cut.id).astype(np.float64)
            total += frames.sum(axis=0)
            total_sq += np.square(frames).sum(axis=0)
            count += len(frames)
    else:
        cuts = list(cuts)
        chunks = [cuts[i:i + SHARD_CUTS] for i in range(0, len(cuts), SHARD_CUTS)]
        for _, chunk_failures, chunk_total, chunk_sq, chunk_count in run_chunks(
                chunks, filterbank, [None] * len(chunks), jobs, progress, "fbank statistics"):
            failures.update(chunk_failures)
            total += chunk_total
            total_sq += chunk_sq
            count += chunk_count
    stats = FeatureStats.from_sums(total, total_sq, count)
    if not failures:
        try:
            Path(directory).mkdir(parents=True, exist_ok=True)
            write_atomic(stats_file, lambda f: f.write(stats.to_json().encode()))
        except OSError as error:   # a read-only cache of complete features: computed again next time
            if error.errno not in (errno.EROFS, errno.EACCES, errno.EPERM):
                raise
    return stats, failures

"""Streaming shards: a split's cuts and their features, prepared once, read window by window.

The eager path (asr.data.datamodule) reads, checks and tokenises every cut of a split at every
training start and keeps them in memory: at 10,000 h that is 12.5 GB and 6.6 minutes per process
(asr/RESULTS.md, "Scale"). A streamed split does that work once (asr.data.streaming.stream_preparation) and
keeps in memory only the window of shards it is batching (asr.data.batching.stream_sampler).

Layout, under `{cache}/{FilterBank.cache_key}/{split}/stream/` (beside the eager cache's shards):

    shard-000000.lilcom           the lilcom-compressed frames of up to `shard_cuts` cuts, one blob per
                                  cut, concatenated (the eager cache's encoding, asr.data.features.feature_cache)
    shard-000000.cuts.jsonl.gz    one JSON list per cut: [id, duration, frames, byte offset, byte length,
                                  words, phones] - all a batch needs (no audio path: features only)
    shard-000000.json             the shard's summary, written last (a shard without it is unfinished):
                                  cuts, seconds, the duration histogram, feature sums, the characters
                                  and phone set of its transcripts, the cuts left out and why
    index.json, histograms.npy    the split: written once every shard is finished (what a training
                                  start reads: a few MB at 100,000 h, never the cuts themselves)
    texts.txt.gz                  an even sample of the transcripts (a sentencepiece tokenizer's text)

Shard k holds the cuts k*shard_cuts ... (k+1)*shard_cuts-1 of the source manifest (less those left
out), so preparation resumes shard by shard: a rerun skips finished shards (reading their manifest
lines without parsing them) and redoes the rest. Shards of another source (its size or mtime
changed) are redone.

Writing them: asr.data.streaming.stream_preparation (what is checked per cut, and when).
"""
from __future__ import annotations

import gzip
import json
import math
import os
from pathlib import Path

import numpy as np

from asr.data.features.feature_stats import FeatureStats
from asr.data.corpus.manifests import ManifestError, StreamCut

FORMAT = 1
DURATION_GRID = 0.1          # seconds per histogram bin: bin j holds durations in (j*grid, (j+1)*grid]
MAX_SHARD_CUTS = 65535       # the histograms count a shard's cuts per bin in uint16


def duration_bin(duration: float) -> int:
    """The histogram bin of a duration: bin j holds (j*DURATION_GRID, (j+1)*DURATION_GRID]."""
    return max(0, math.ceil(round(duration / DURATION_GRID, 9)) - 1)


def shard_name(shard: int) -> str:
    return f"shard-{shard:06d}"


def stream_folder(split_features: Path) -> Path:
    """The stream of a split whose eager features live in `split_features` ({cache}/{key}/{split})."""
    return Path(split_features) / "stream"


def source_key(manifest: Path) -> str:
    stat = os.stat(manifest)
    return f"{stat.st_size}:{stat.st_mtime_ns}"


def read_records(folder: Path, shard: int) -> list[list]:
    path = Path(folder) / f"{shard_name(shard)}.cuts.jsonl.gz"
    try:
        with gzip.open(path, "rt", encoding="utf-8") as f:
            return [json.loads(line) for line in f]
    except (OSError, EOFError, ValueError) as error:
        raise ManifestError(f"cannot read the records of {path} ({type(error).__name__}: {error}); delete "
                            f"{path.with_name(shard_name(shard) + '.json')} and run python -m asr.prepare_shards "
                            "again to write that shard anew") from None


def read_shard_cuts(folder: Path, shard: int) -> list[StreamCut]:
    return [StreamCut(record, shard) for record in read_records(folder, shard)]


class StreamIndex:
    """A prepared split: its index.json, and readers of its histograms, shards and texts."""

    def __init__(self, folder: Path, index: dict):
        self.folder = Path(folder)
        self.index = index

    @staticmethod
    def open(folder: Path, manifest: Path | None = None) -> "StreamIndex | None":
        """The finished stream in `folder`, or None if there is none or it is not of `manifest` as it is now."""
        path = Path(folder) / "index.json"
        try:
            index = json.loads(path.read_text())
        except (OSError, ValueError):   # none yet, or damaged: written again from the shards' summaries
            return None
        if index.get("format") != FORMAT:
            return None
        if manifest is not None and (not Path(manifest).is_file() or index["source"] != source_key(manifest)):
            return None
        return StreamIndex(folder, index)

    @property
    def shards(self) -> int:
        return self.index["shards"]

    @property
    def cuts(self) -> int:
        return self.index["cuts"]

    @property
    def hours(self) -> float:
        return self.index["seconds"] / 3600.0

    @property
    def shard_cuts(self) -> int:
        return self.index["shard_cuts"]

    @property
    def longest(self) -> float:
        """An upper bound of every duration: the top of the highest histogram bin."""
        return self.index["bins"] * self.index["grid"]

    @property
    def feature_stats(self) -> FeatureStats:
        return FeatureStats.from_json(json.dumps(self.index["stats"]))

    def total_histogram(self) -> np.ndarray:
        total = np.zeros(self.index["bins"], dtype=np.int64)
        for rows in self.histogram_rows():
            total += rows.sum(axis=0, dtype=np.int64)
        return total

    def histogram_rows(self, chunk: int = 1024):
        """The per-shard histograms in chunks of rows, read from the file (not mapped: mapped pages
        would count as this process's memory)."""
        with open(self.folder / "histograms.npy", "rb") as f:
            version = np.lib.format.read_magic(f)
            read_header = np.lib.format.read_array_header_1_0 if version == (1, 0) else np.lib.format.read_array_header_2_0
            shape, _, dtype = read_header(f)
            for start in range(0, shape[0], chunk):
                rows = min(chunk, shape[0] - start)
                yield np.fromfile(f, dtype=dtype, count=rows * shape[1]).reshape(rows, shape[1])

    def texts(self) -> list[str]:
        with gzip.open(self.folder / "texts.txt.gz", "rt", encoding="utf-8") as f:
            return f.read().split("\n")

    def cuts_of(self, shard: int) -> list[StreamCut]:
        return read_shard_cuts(self.folder, shard)


class StreamedFeatures:
    """Features read from the shards: `load(cut)` reads and decompresses one blob (os.pread)."""

    MAX_OPEN = 64

    def __init__(self, folder: Path):
        self.folder = Path(folder)
        self._open: dict[int, int] = {}

    def num_frames(self, cut: StreamCut) -> int:
        return cut.num_frames

    def load(self, cut: StreamCut):
        import lilcom
        import torch

        descriptor = self._open.get(cut.shard)
        if descriptor is None:
            if len(self._open) >= self.MAX_OPEN:
                os.close(self._open.pop(next(iter(self._open))))
            descriptor = self._open[cut.shard] = os.open(self.folder / f"{shard_name(cut.shard)}.lilcom", os.O_RDONLY)
        return torch.from_numpy(lilcom.decompress(os.pread(descriptor, cut.length, cut.offset)))

    def __getstate__(self):
        return {"folder": self.folder, "_open": {}}   # each process opens the files itself

    def __del__(self):
        for descriptor in getattr(self, "_open", {}).values():
            os.close(descriptor)

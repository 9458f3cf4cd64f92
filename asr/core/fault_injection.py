"""A test hook of the fault suite (tests/asr/test_faults.py): stop a process at a named point so
that a test can kill it there (kill -9), at a moment it could not hit by timing alone.

Off unless the environment sets ASR_PAUSE_AT; then, the n-th time this process reaches the point

    ASR_PAUSE_AT=<point>[:<n>]    (n defaults to 1)

it creates the file ASR_PAUSE_MARKER names and sleeps until it is killed. The points:

    feature_shard_index   asr.data.features.feature_cache: a shard's frames are on disk, its index is not yet
    stream_shard_summary  asr.data.streaming.stream_preparation: a streaming shard's frames and cuts are on disk,
                          its summary (what marks it finished) is not yet
    checkpoint_replace    asr.model.checkpoint.AtomicCheckpointIO: a new checkpoint is whole in its temporary file,
                          about to be renamed over the existing one
    cross_matrix_cell     asr.cross_matrix: a cell is about to be evaluated
"""
from __future__ import annotations

import os
import time
from collections import Counter
from pathlib import Path

_arrivals: Counter = Counter()


def pause_point(point: str) -> None:
    """Sleeps forever here if ASR_PAUSE_AT names this point (and this arrival); else returns at once."""
    wanted = os.environ.get("ASR_PAUSE_AT")
    if not wanted:
        return
    name, _, count = wanted.partition(":")
    if name != point:
        return
    _arrivals[point] += 1
    if _arrivals[point] != int(count or 1):
        return
    Path(os.environ["ASR_PAUSE_MARKER"]).write_text(f"{point} {os.getpid()}\n")
    while True:
        time.sleep(60)

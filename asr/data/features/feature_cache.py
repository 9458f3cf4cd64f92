"""Filter-bank features on disk (the mean/variance statistics of the training features, cached beside
them: asr.data.features.feature_stats).

Layout, under `{cache}/{FilterBank.cache_key}/`, where `{cache}` is `data.cache_dir` or, by default,
`{data.root}/features` (the key changes with any feature option, so 40- and 80-dim features, say,
live side by side and never mix):

    options.json                       the FilterBank options (for people)
    {split}/shard-<time>-<id>.lilcom   the lilcom-compressed frames of up to `SHARD_CUTS` cuts, one blob
                                       per cut, concatenated
    {split}/shard-<time>-<id>.json     {cut_id: [byte_offset, byte_length, num_frames, fingerprint]} -
                                       written last, so a shard without its index (an interrupted write)
                                       is ignored
    {split}/stats-<hash>.json          mean/std over the frames of one exact set of training cuts

Frames are stored with lilcom (lhotse's standard storage for filter banks), in steps of
2^LILCOM_TICK_POWER = 1/256 of a log-mel unit: the error (at most 1/512) is far below the features'
own spread (a std of about 8 per dimension before normalisation), and the cache is 2.3-2.5x smaller
than float32 (the demo's 40-dim features: 408 MB as float32). Shards of the earlier float32 format
(`.npy`) are not read: their cuts are computed again and the old shards deleted.

A cut's fingerprint is its audio path, the file's size and mtime, the recording's transforms (a
speed-perturbed copy's), and the cut's start/duration/channel: regenerated audio is recomputed,
everything else is reused. Work is saved shard by shard, so an interrupted or failed run keeps what it finished and the next run computes only the rest.
Where a cut is in several shards (its audio changed), the newest shard wins; shards left with no
live cut are deleted, but only while no other process reads the split (`remove_superseded_shards`).

Processes that share a cache (two runs on one corpus, the processes of one run) never break each
other: its writers hold the cache folder's lock (asr.core.corpus_lock, taken by the data
module), each file is written under a name of its own and renamed into place, and each FeatureStore
holds a shared lock on its split's READERS_LOCK for as long as it lives, which a writer must get
exclusively to delete a shard.

A batch reads (os.pread) and decompresses just its cuts' blobs. Not a memory map: the pages a map
touches count as the process's resident memory, and over an epoch it touched the whole cache (2.6 GB
at 100 h, the cache's size at 1,000 h: asr/RESULTS.md, "Scale"); read, they stay the kernel's page
cache. Each process (DataLoader workers too) opens the files itself.

A split's features are attached with `attach_features`: `StoredFeatures` (this cache) or, with
`data.precompute_features=false`, `OnTheFlyFeatures` (computed from the audio per batch); the
dataset reads either the same way.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import fcntl
import hashlib
import json
import multiprocessing
import os
import time
import uuid
from pathlib import Path

import lilcom
import numpy as np
import torch

from asr.data.audio.command_sources import announce_recording_commands
from asr.data.features.features import FilterBank
from asr.core.fault_injection import pause_point

SHARD_CUTS = 256
MAX_OPEN_SHARDS = 64      # file descriptors a FeatureStore keeps open (the oldest is closed first)
SHARD_SUFFIX = ".lilcom"
LILCOM_TICK_POWER = -8      # lhotse's default for filter banks
LILCOM_HALF_TICK = 2.0 ** (LILCOM_TICK_POWER - 1)    # the largest error of a stored value
READERS_LOCK = ".readers.lock"   # in a split's folder: shared by its readers, exclusive to delete shards


def audio_fingerprint(cut) -> str:
    """What the features of `cut` depend on besides the FilterBank options."""
    parts = []
    for source in cut.recording.sources:
        if source.type == "file":
            try:
                stat = os.stat(source.source)
                parts.append(f"{source.source}:{stat.st_size}:{stat.st_mtime_ns}")
            except OSError:
                parts.append(f"{source.source}:missing")
        else:
            parts.append(f"{source.type}:{str(source.source)[:200]}")
    # transforms (a speed-perturbed copy's resampling) change the audio; none: the key stays as it was
    transforms = getattr(cut.recording, "transforms", None)
    if transforms:
        parts.append(json.dumps([t if isinstance(t, dict) else t.to_dict() for t in transforms], sort_keys=True))
    return f"{'|'.join(parts)}|{cut.start:.6f}|{cut.duration:.6f}|{cut.channel}"


def fingerprint_digest(fingerprint: str) -> bytes:
    """8 bytes that stand for a fingerprint in memory (a stale entry slips through with odds 2^-64)."""
    return hashlib.blake2b(fingerprint.encode(), digest_size=8).digest()


def recordings_read_by(cut) -> list:
    """The recordings whose audio a cut reads: its own, or a mixed cut's tracks' (an augmented cut
    mixed with noise; padding reads none)."""
    tracks = getattr(cut, "tracks", None)
    if tracks is not None:
        return [recording for track in tracks for recording in recordings_read_by(track.cut)]
    recording = getattr(cut, "recording", None)
    return [] if recording is None else [recording]


def load_waveform(cut) -> np.ndarray:
    """The cut's samples (1-D float32); RuntimeError naming the cut and its file if they cannot be read
    or are not all finite (NaN or infinite samples would make NaN features, and an empty transcript).
    Audio from a shell command gets here only with data.allow_commands (asr.data.audio.command_sources),
    which logs each command the first time it runs."""
    recordings = recordings_read_by(cut)
    paths = ", ".join(str(s.source) for r in recordings for s in r.sources if s.type == "file") or "non-file source"
    for recording in recordings:
        announce_recording_commands(recording)
    try:
        audio = cut.load_audio()
    except Exception as error:  # lhotse/soundfile raise many types for bad audio
        first_line = (str(error).strip().splitlines() or [""])[0]   # lhotse appends pages of context
        raise RuntimeError(f"cannot read the audio of cut {cut.id} ({paths}): "
                           f"{type(error).__name__}: {first_line}") from error
    if not np.isfinite(audio).all():
        raise RuntimeError(f"the audio of cut {cut.id} ({paths}) holds NaN or infinite samples")
    return audio[0] if audio.ndim == 2 else audio


@contextlib.contextmanager
def single_torch_thread():
    """Feature extraction per utterance is too small to gain from intra-op threads, and on a busy
    2-core machine those threads cost more than they give (measured: 60x slower); jobs parallelise."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(before)


class FeatureStore:
    """The cached features of one split: `load(cut_id) -> (T, F) float32 array`."""

    def __init__(self, directory: Path, num_mel_bins: int):
        self.directory = Path(directory)
        self.num_mel_bins = num_mel_bins
        # cut_id -> (shard, byte offset, byte length, frames, fingerprint digest): the digest, not the
        # ~150-character fingerprint: 309 instead of 421 bytes an entry, 60 MB less at 1,000 h
        self.index: dict[str, tuple[str, int, int, int, bytes]] = {}
        self._shards: dict[str, int] = {}   # shard -> an open file descriptor
        # held before the index is read: a shard it names stays on disk while this store lives
        self._readers_lock = _hold_readers_lock(self.directory)
        if self.directory.is_dir():
            # Shard names start with their creation time: a later shard's entry replaces an earlier one.
            for index_file in sorted(self.directory.glob("shard-*.json")):
                shard = index_file.stem
                if not (self.directory / f"{shard}{SHARD_SUFFIX}").is_file():
                    continue    # an interrupted write, or a shard of the old float32 format
                entries = json.loads(index_file.read_text())
                for cut_id, (offset, length, frames, fingerprint) in entries.items():
                    self.index[cut_id] = (shard, int(offset), int(length), int(frames), fingerprint_digest(fingerprint))

    def has(self, cut) -> bool:
        entry = self.index.get(cut.id)
        return entry is not None and entry[4] == fingerprint_digest(audio_fingerprint(cut))

    def num_frames(self, cut_id: str) -> int:
        return self.index[cut_id][3]

    def load(self, cut_id: str) -> np.ndarray:
        shard, offset, length, _, _ = self.index[cut_id]
        descriptor = self._shards.get(shard)
        if descriptor is None:
            if len(self._shards) >= MAX_OPEN_SHARDS:   # stay far below the open-files limit
                os.close(self._shards.pop(next(iter(self._shards))))
            descriptor = self._shards[shard] = os.open(self.directory / f"{shard}{SHARD_SUFFIX}", os.O_RDONLY)
        return lilcom.decompress(os.pread(descriptor, length, offset))

    def close(self) -> None:
        """Closes the shards and lets go of the split (a writer may then delete what this store indexed)."""
        for descriptor in getattr(self, "_shards", {}).values():
            os.close(descriptor)
        self._shards = {}
        if getattr(self, "_readers_lock", None) is not None:
            self._readers_lock.close()   # closing the file releases its flock
            self._readers_lock = None

    def __del__(self):
        self.close()

    def __getstate__(self):
        state = self.__dict__.copy()
        state["_shards"] = {}  # each process opens the files itself
        state["_readers_lock"] = None   # the process that made the store holds the split for its workers
        return state


def _hold_readers_lock(directory: Path):
    """An open READERS_LOCK of `directory` with a shared flock on it, or None where it cannot be had
    (no folder yet, a read-only one: nothing can delete shards there either)."""
    path = Path(directory) / READERS_LOCK
    for mode in ("a", "r"):
        try:
            handle = open(path, mode)
        except OSError:
            continue
        try:
            fcntl.flock(handle, fcntl.LOCK_SH)
        except OSError:   # a file system without flock: no one gets it exclusively either
            handle.close()
            return None
        return handle
    return None


def remove_superseded_shards(directory: Path) -> None:
    """Deletes the shards of `directory` none of whose cuts they still provide (all recomputed into later
    shards, or written in the old float32 format), unless another process reads the split (holds its
    READERS_LOCK): a reader's index may name them. They are then left for a later writer; meanwhile the
    newest shard of each cut is the one read. The caller holds the cache's write lock and no store of
    this split."""
    directory = Path(directory)
    try:
        handle = open(directory / READERS_LOCK, "a")
    except OSError:
        return
    with handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:   # another process reads the split (or flock is missing): delete nothing
            return
        # while this is held no reader can start (it waits for the shared lock before reading the index)
        index: dict[str, str] = {}
        for index_file in sorted(directory.glob("shard-*.json")):
            if (directory / f"{index_file.stem}{SHARD_SUFFIX}").is_file():
                index.update(dict.fromkeys(json.loads(index_file.read_text()), index_file.stem))
        live = set(index.values())
        for index_file in directory.glob("shard-*.json"):
            if index_file.stem not in live:
                index_file.unlink(missing_ok=True)
                for suffix in (SHARD_SUFFIX, ".npy"):
                    (directory / f"{index_file.stem}{suffix}").unlink(missing_ok=True)


def compress_frames(frames: np.ndarray) -> bytes:
    """One cut's (T, F) float32 frames as a lilcom blob (lilcom quantises its input in place: a copy)."""
    return lilcom.compress(np.array(frames, dtype=np.float32, copy=True), tick_power=LILCOM_TICK_POWER)


def _compute_chunk(cuts: list, filterbank_options: dict, shard_path: str | None):
    """Features of `cuts`: written as one shard when `shard_path` is given, else only summed for statistics.

    Returns (index entries, failures {cut_id: message}, frame sum, frame sum of squares, frame count).
    """
    filterbank = FilterBank(**filterbank_options)
    blobs, entries, failures = [], {}, {}
    total = np.zeros(filterbank.num_mel_bins)
    total_sq = np.zeros(filterbank.num_mel_bins)
    count, offset = 0, 0
    with single_torch_thread():
        for cut in cuts:
            try:
                feats = filterbank(load_waveform(cut)).numpy()
            except RuntimeError as error:
                failures[cut.id] = str(error)
                continue
            as64 = feats.astype(np.float64)
            total += as64.sum(axis=0)
            total_sq += np.square(as64).sum(axis=0)
            count += len(feats)
            if shard_path is not None:
                blob = compress_frames(feats)
                blobs.append(blob)
                entries[cut.id] = [offset, len(blob), len(feats), audio_fingerprint(cut)]
                offset += len(blob)
    if shard_path is not None and entries:
        write_atomic(Path(shard_path).with_suffix(SHARD_SUFFIX), lambda f: f.write(b"".join(blobs)))
        pause_point("feature_shard_index")   # the fault suite kills here: frames without their index
        write_atomic(Path(shard_path).with_suffix(".json"), lambda f: f.write(json.dumps(entries).encode()))
    return entries, failures, total, total_sq, count


def write_atomic(path: Path, write) -> None:
    """Writes `path` whole or not at all: under a temporary name of this process's own, then renamed."""
    temporary = path.with_name(f".{path.name}.{os.getpid()}-{uuid.uuid4().hex[:8]}.tmp")
    try:
        with open(temporary, "wb") as f:
            write(f)
        os.replace(temporary, path)
    except BaseException:
        temporary.unlink(missing_ok=True)
        raise


def filterbank_worker_options(filterbank: FilterBank) -> dict:
    return {"num_mel_bins": filterbank.num_mel_bins, "sampling_rate": filterbank.sampling_rate,
            "frame_length_ms": filterbank.frame_length_ms, "frame_shift_ms": filterbank.frame_shift_ms,
            "low_freq": filterbank.low_freq, "high_freq": filterbank.high_freq,
            "preemphasis": filterbank.preemphasis}


def run_chunks(chunks: list[list], filterbank: FilterBank, shard_paths: list[str | None], jobs: int,
                progress: bool, description: str):
    """Yield `_compute_chunk` results for each chunk, in `jobs` processes when there is more than one chunk."""
    from tqdm.auto import tqdm

    options = filterbank_worker_options(filterbank)
    total = sum(len(chunk) for chunk in chunks)
    with tqdm(total=total, desc=description, unit="utt", disable=not progress or total == 0) as bar:
        if jobs <= 1 or len(chunks) <= 1:
            for chunk, shard in zip(chunks, shard_paths):
                result = _compute_chunk(chunk, options, shard)
                bar.update(len(chunk))
                yield result
            return
        # spawn, not fork: a forked child of a process that has started OpenMP threads can hang.
        context = multiprocessing.get_context("spawn")
        with concurrent.futures.ProcessPoolExecutor(min(jobs, len(chunks)), mp_context=context) as pool:
            futures = {pool.submit(_compute_chunk, chunk, options, shard): len(chunk)
                       for chunk, shard in zip(chunks, shard_paths)}
            for future in concurrent.futures.as_completed(futures):
                bar.update(futures[future])
                yield future.result()


def feature_directory(cache: str | os.PathLike, filterbank: FilterBank) -> Path:
    directory = Path(cache) / filterbank.cache_key
    directory.mkdir(parents=True, exist_ok=True)
    options_file = directory / "options.json"
    if not options_file.exists():   # processes may get here at once: each writes its own temporary file
        temporary = options_file.with_name(f"options.{uuid.uuid4().hex[:8]}.tmp")
        temporary.write_text(json.dumps(filterbank.options, indent=2))
        os.replace(temporary, options_file)
    return directory


def precompute_features(cuts, filterbank: FilterBank, directory: Path, jobs: int = 1,
                        progress: bool = True, description: str = "fbank", lock=None):
    """Make sure `directory` holds the features of every cut; compute only the missing or stale ones.

    `lock`: for processes that share the cache (other runs on the corpus, the processes of a
    multi-process run), a context manager factory that one process holds at a time (the data module
    gives the cache folder's, asr.core.corpus_lock.writing_corpus_folder). A process that
    finds every cut's features reads them without it; one that finds some missing takes it and looks
    again - another process may have computed them meanwhile - before it computes and writes the rest.
    Without a lock the caller makes sure no other process writes the cache.

    Returns (FeatureStore, failures {cut_id: message}) - cuts whose audio could not be read are not stored.
    """
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    store = FeatureStore(directory, filterbank.num_mel_bins)
    missing = [cut for cut in cuts if not store.has(cut)]
    if missing and lock is not None:
        store.close()   # holding the split while waiting would keep the writer from tidying it
        with lock():
            return precompute_features(cuts, filterbank, directory, jobs, progress, description)
    chunks = [missing[i:i + SHARD_CUTS] for i in range(0, len(missing), SHARD_CUTS)]
    shard_paths = [str(directory / f"shard-{time.time_ns():020d}-{uuid.uuid4().hex[:8]}") for _ in chunks]
    failures: dict[str, str] = {}
    for _, chunk_failures, *_ in run_chunks(chunks, filterbank, shard_paths, jobs, progress, description):
        failures.update(chunk_failures)
    if missing:
        store.close()
        remove_superseded_shards(directory)
        store = FeatureStore(directory, filterbank.num_mel_bins)
    return store, failures


class StoredFeatures:
    """Features read from the cache on disk."""

    def __init__(self, store: FeatureStore):
        self.store = store

    def num_frames(self, cut) -> int:
        return self.store.num_frames(cut.id)

    def load(self, cut) -> torch.Tensor:
        return torch.from_numpy(self.store.load(cut.id))


class OnTheFlyFeatures:
    """Features computed from the audio each time a batch is built."""

    def __init__(self, filterbank: FilterBank):
        self.filterbank = filterbank

    def num_frames(self, cut) -> int:
        return self.filterbank.num_frames(cut.num_samples)

    def load(self, cut) -> torch.Tensor:
        with single_torch_thread():
            return self.filterbank(load_waveform(cut))


def attach_features(cuts, filterbank: FilterBank, precompute: bool, cache: str | os.PathLike, split: str,
                    jobs: int = 1, progress: bool = True, lock=None):
    """Where each cut's features come from: with `precompute`, the cache under `cache` (computed now
    for the cuts it lacks or holds stale; `lock` as in precompute_features); otherwise the audio, each
    time a batch is built.

    Returns (StoredFeatures or OnTheFlyFeatures, failures {cut_id: message}): cuts whose audio could
    not be read past its header are not stored (only in the precompute mode)."""
    if not precompute:
        return OnTheFlyFeatures(filterbank), {}
    store, failures = precompute_features(list(cuts), filterbank, feature_directory(cache, filterbank) / split,
                                          jobs, progress, f"fbank {split}", lock)
    return StoredFeatures(store), failures

"""Writing a split's streaming shards (the layout: asr.data.streaming.stream_shards): `prepare_stream`, resumable
shard by shard, then the index from the shards' summaries.

Per cut, once, here: the structure checks of asr.data.corpus.manifests, empty transcripts (left out and
counted), the audio checks of asr.data.splits.cut_checks (bad audio is left out and listed; the index is
written only with `skip_bad_audio`, as data.skip_bad_audio says), the features, the duration (its
bucket), the transcripts (stored normalised as the manifest has them; a batch encodes its own).
Per training start: the index, the tokenizers (phones and chars from the index; sentencepiece from
`texts.txt.gz`), the statistics (over every frame: the shards' sums, no extra pass).
Decision: duplicated ids are found when the index is written, from 8-byte hashes of every id (37 MB
at 10,000 h); their odds of a false alarm are 2^-64 per pair, and the message names the ids.
"""
from __future__ import annotations

import concurrent.futures
import gzip
import hashlib
import json
import math
import multiprocessing
import os
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import lilcom
import numpy as np
from lhotse import CutSet
from lhotse.serialization import deserialize_item

from asr.core.fault_injection import pause_point
from asr.data.audio.command_sources import (COMMAND_SOURCE_TYPE, CommandNotAllowedError, recording_commands,
                                            refuse_command)
from asr.data.splits.cut_checks import UtteranceProblems, find_bad_audio, find_empty_transcripts
from asr.data.features.feature_cache import (compress_frames, filterbank_worker_options, load_waveform, single_torch_thread,
                                             write_atomic)
from asr.data.features.feature_stats import FeatureStats
from asr.data.features.features import SAMPLING_RATE, FilterBank
from asr.data.corpus.manifests import ManifestError, listing, transcript, with_absolute_sources
from asr.data.streaming.stream_shards import (DURATION_GRID, FORMAT, MAX_SHARD_CUTS, StreamIndex, duration_bin, read_records,
                                              shard_name, source_key)

TEXT_SAMPLE = 100_000        # transcripts kept for training a sentencepiece tokenizer
ID_HASH_BYTES = 8


@dataclass(frozen=True)
class ShardJob:
    folder: str
    shard: int
    lines: list            # the source manifest's JSON lines of this shard
    root: str              # relative audio paths are relative to it
    filterbank: dict
    source: str            # source_key of the manifest


def _shard_cuts(job: ShardJob) -> CutSet:
    cuts, wrong = [], []
    for line in job.lines:
        cut = deserialize_item(json.loads(line))
        if len(cut.supervisions) != 1 or not cut.has_recording:
            wrong.append(cut.id)
        cuts.append(with_absolute_sources(cut, Path(job.root)))
    if wrong:
        raise ManifestError(f"every cut needs one recording and exactly one supervision (the utterance's "
                            f"transcript); these do not: {listing(wrong)}")
    return CutSet.from_cuts(cuts)


def write_shard(job: ShardJob) -> dict:
    """Check, compute and write shard `job.shard`; returns its summary (also written, last)."""
    filterbank = FilterBank(**job.filterbank)
    cuts = _shard_cuts(job)
    problems = UtteranceProblems()
    find_empty_transcripts(cuts, {"text"}, problems)
    find_bad_audio(cuts, problems)
    records, blobs, offset = [], [], 0
    histogram = Counter()
    total, total_sq, frames_count = np.zeros(filterbank.num_mel_bins), np.zeros(filterbank.num_mel_bins), 0
    chars, phone_symbols, no_phones, phone_sets = set(), set(), 0, set()
    with single_torch_thread():
        for cut in cuts:
            if cut.id in problems.cut_ids():
                continue
            if cut.sampling_rate != SAMPLING_RATE or filterbank.num_frames(cut.num_samples) == 0:
                problems.add("bad_audio", cut.id, f"{cut.sampling_rate} Hz, {cut.duration:.3f} s: the features need "
                                                  f"{SAMPLING_RATE} Hz and one {filterbank.frame_length_ms:g} ms frame")
                continue
            try:
                features = filterbank(load_waveform(cut)).numpy()
            except RuntimeError as error:
                problems.add("bad_audio", cut.id, str(error))
                continue
            blob = compress_frames(features)
            blobs.append(blob)
            text, phones = transcript(cut, "text"), transcript(cut, "phones")
            duration = round(cut.duration, 6)   # as stored: the histogram's bin and the sampler's agree
            records.append([cut.id, duration, len(features), offset, len(blob), text, phones])
            offset += len(blob)
            histogram[duration_bin(duration)] += 1
            as64 = lilcom.decompress(blob).astype(np.float64)   # the statistics of the frames training reads
            total += as64.sum(axis=0)
            total_sq += np.square(as64).sum(axis=0)
            frames_count += len(features)
            chars.update(text)
            phone_symbols.update(phones.split())
            no_phones += not phones.strip()
            phone_sets.add((cut.supervisions[0].custom or {}).get("phone_set", ""))
    folder = Path(job.folder)
    name = folder / shard_name(job.shard)
    write_atomic(name.with_suffix(".lilcom"), lambda f: f.write(b"".join(blobs)))
    lines = "".join(json.dumps(record, ensure_ascii=False) + "\n" for record in records)
    write_atomic(name.with_suffix(".cuts.jsonl.gz"), lambda f: f.write(gzip.compress(lines.encode(), compresslevel=1)))
    pause_point("stream_shard_summary")   # the fault suite kills here: a shard without its summary
    summary = {"format": FORMAT, "shard": job.shard, "source": job.source, "source_lines": len(job.lines),
               "cuts": len(records), "seconds": sum(r[1] for r in records), "frames": frames_count,
               "histogram": {str(b): n for b, n in sorted(histogram.items())},
               "sum": total.tolist(), "sum_sq": total_sq.tolist(), "chars": "".join(sorted(chars)),
               "phone_symbols": sorted(phone_symbols), "no_phones": no_phones, "phone_sets": sorted(phone_sets), "problems": problems.by_reason}
    write_atomic(name.with_suffix(".json"), lambda f: f.write(json.dumps(summary).encode()))
    return summary


def _source_chunks(manifest: Path, shard_cuts: int):
    """(shard number, its manifest lines), reading lines without parsing them."""
    chunk, shard = [], 0
    with gzip.open(manifest, "rt", encoding="utf-8") as f:
        for line in f:
            if line.strip():
                chunk.append(line)
                if len(chunk) == shard_cuts:
                    yield shard, chunk
                    chunk, shard = [], shard + 1
    if chunk:
        yield shard, chunk


def refuse_manifest_commands(manifest: Path, allowed: bool) -> None:
    """ManifestError at the first cut of `manifest` whose audio comes from a shell command, unless
    `allowed`. One pass over the lines; only those that mention a command source are parsed."""
    if allowed:
        return
    with gzip.open(manifest, "rt", encoding="utf-8") as f:
        for number, line in enumerate(f, start=1):
            if COMMAND_SOURCE_TYPE not in line:
                continue
            try:
                cut = json.loads(line)
            except ValueError:
                continue    # a malformed line: the shard that holds it says so
            for command in recording_commands(cut.get("recording") if isinstance(cut, dict) else None):
                try:
                    refuse_command(manifest, f"line {number} (cut {cut.get('id')})", command, allowed)
                except CommandNotAllowedError as error:
                    raise ManifestError(str(error)) from None


def _finished_summary(folder: Path, shard: int, source: str) -> dict | None:
    path = folder / f"{shard_name(shard)}.json"
    try:
        summary = json.loads(path.read_text())
    except (OSError, ValueError):   # missing, or damaged by something else: the shard is written again
        return None
    return summary if summary.get("source") == source and summary.get("format") == FORMAT else None


def prepare_stream(manifest: Path, root: Path, folder: Path, filterbank: FilterBank, shard_cuts: int = 1000,
                   jobs: int = 1, progress: bool = True, skip_bad_audio: bool = False,
                   description: str = "shards", allow_commands: bool = False) -> "StreamIndex":
    """Write the shards of `manifest` that are missing or stale, then the index; returns the index.
    Finished shards are kept whatever fails later (the next call resumes). A cut whose audio comes
    from a shell command is a ManifestError unless `allow_commands` (asr.data.audio.command_sources),
    found before any shard is written."""
    from tqdm.auto import tqdm

    if not 1 <= shard_cuts <= MAX_SHARD_CUTS:
        raise ValueError(f"shard_cuts={shard_cuts} must lie in [1, {MAX_SHARD_CUTS}]")
    manifest, folder = Path(manifest), Path(folder)
    existing = StreamIndex.open(folder, manifest) if folder.is_dir() else None
    if existing is not None and existing.shard_cuts == shard_cuts:
        return existing
    refuse_manifest_commands(manifest, allow_commands)
    folder.mkdir(parents=True, exist_ok=True)
    source = source_key(manifest)
    options = filterbank_worker_options(filterbank)
    summaries: dict[int, dict] = {}
    context = multiprocessing.get_context("spawn")   # as the eager cache: no fork after OpenMP threads
    pool = concurrent.futures.ProcessPoolExecutor(jobs, mp_context=context) if jobs > 1 else None
    pending: dict = {}
    with tqdm(desc=description, unit="utt", disable=not progress) as bar:
        def collect(future_or_summary):
            summary = future_or_summary.result() if pool else future_or_summary
            summaries[summary["shard"]] = summary
            bar.update(summary["source_lines"])

        for shard, lines in _source_chunks(manifest, shard_cuts):
            done = _finished_summary(folder, shard, source)
            if done is not None and done["source_lines"] == len(lines):
                summaries[shard] = done
                bar.update(len(lines))
                continue
            job = ShardJob(str(folder), shard, lines, str(root), options, source)
            if pool is None:
                collect(write_shard(job))
                continue
            pending[pool.submit(write_shard, job)] = shard
            while len(pending) >= 2 * jobs:   # bounded: at most 2 x jobs shards of lines in memory
                finished, _ = concurrent.futures.wait(pending, return_when=concurrent.futures.FIRST_COMPLETED)
                for future in finished:
                    pending.pop(future)
                    collect(future)
        for future in concurrent.futures.as_completed(list(pending)):
            collect(future)
    if pool is not None:
        pool.shutdown()
    return write_index(folder, manifest, source, shard_cuts, [summaries[k] for k in sorted(summaries)],
                       filterbank, skip_bad_audio)


def _bad_audio_error(folder: Path, bad: dict[str, str], shards: list[int]) -> ManifestError:
    names = ", ".join(f"{shard_name(s)}.json" for s in shards[:5]) + (" ..." if len(shards) > 5 else "")
    return ManifestError(
        f"{len(bad)} utterances have missing or unusable audio: "
        f"{listing(f'{cut_id} ({detail})' for cut_id, detail in bad.items())}; fix them and delete their "
        f"shards' summaries in {folder} ({names}) to redo those shards, or set data.skip_bad_audio=true to "
        "leave them out (every other shard is kept)")


def write_index(folder: Path, manifest: Path, source: str, shard_cuts: int, summaries: list[dict],
                filterbank: FilterBank, skip_bad_audio: bool) -> "StreamIndex":
    """The split's index from its shards' summaries: checks what can only be checked over every cut."""
    bad = {cut_id: detail for s in summaries for cut_id, detail in s["problems"].get("bad_audio", {}).items()}
    if bad and not skip_bad_audio:
        raise _bad_audio_error(folder, bad, [s["shard"] for s in summaries if s["problems"].get("bad_audio")])
    _check_unique_ids(folder, len(summaries))
    bins = 1 + max((int(b) for s in summaries for b in s["histogram"]), default=0)
    histograms = np.zeros((len(summaries), bins), dtype=np.uint16)
    for row, summary in enumerate(summaries):
        for b, n in summary["histogram"].items():
            histograms[row, int(b)] = n
    stats = FeatureStats.from_sums(np.sum([s["sum"] for s in summaries], axis=0),
                                   np.sum([s["sum_sq"] for s in summaries], axis=0), sum(s["frames"] for s in summaries))
    dropped = Counter()
    for summary in summaries:
        for reason, cuts in summary["problems"].items():
            dropped[reason] += len(cuts)
    phone_sets = sorted({p for s in summaries for p in s["phone_sets"]} - {""})
    index = {"format": FORMAT, "manifest": str(Path(manifest).resolve()), "source": source, "shard_cuts": shard_cuts,
             "shards": len(summaries), "cuts": sum(s["cuts"] for s in summaries),
             "seconds": sum(s["seconds"] for s in summaries), "frames": stats.num_frames,
             "grid": DURATION_GRID, "bins": bins, "chars": "".join(sorted({c for s in summaries for c in s["chars"]})),
             "no_phones": sum(s["no_phones"] for s in summaries), "phone_sets": phone_sets,
             "phone_symbols": sorted({p for s in summaries for p in s["phone_symbols"]}),
             "dropped": dict(dropped), "stats": json.loads(stats.to_json()), "filterbank": filterbank.options}
    if index["cuts"] == 0:
        raise ManifestError(f"{manifest}: no usable utterance (dropped: {dict(dropped)})")
    np.save(folder / "histograms.npy.tmp.npy", histograms)
    os.replace(folder / "histograms.npy.tmp.npy", folder / "histograms.npy")
    _write_text_sample(folder, len(summaries), index["cuts"])
    write_atomic(folder / "index.json", lambda f: f.write(json.dumps(index, indent=1).encode()))
    return StreamIndex(folder, index)


def _check_unique_ids(folder: Path, shards: int) -> None:
    hashes = []
    for shard in range(shards):
        ids = [record[0] for record in read_records(folder, shard)]
        hashes.append(np.frombuffer(b"".join(hashlib.blake2b(i.encode(), digest_size=ID_HASH_BYTES).digest()
                                             for i in ids), dtype=np.uint64))
    every = np.sort(np.concatenate(hashes)) if hashes else np.zeros(0, np.uint64)
    repeated_hashes = set(every[1:][every[1:] == every[:-1]].tolist())
    if not repeated_hashes:
        return
    repeated = sorted({record[0] for shard in range(shards) for record in read_records(folder, shard)
                       if int(np.frombuffer(hashlib.blake2b(record[0].encode(), digest_size=ID_HASH_BYTES).digest(),
                                            dtype=np.uint64)[0]) in repeated_hashes})
    raise ManifestError(f"{len(repeated)} utterance ids appear more than once in the manifest: {listing(repeated)}; "
                        "every utterance needs its own id (remove the copies or rename them in the recipe's output)")


def _write_text_sample(folder: Path, shards: int, cuts: int) -> None:
    """Up to TEXT_SAMPLE transcripts from evenly spaced shards (all of them in a smaller split)."""
    every = max(1, math.ceil(cuts / TEXT_SAMPLE))
    texts = [record[5] for shard in range(0, shards, every) for record in read_records(folder, shard)]
    write_atomic(folder / "texts.txt.gz", lambda f: f.write(gzip.compress("\n".join(texts).encode(), 1)))

"""A corpus of any size made from a small one's audio, for measuring how the data side scales.

`write_scaled_cuts` writes a cut manifest of at least `hours` of audio by repeating the cuts of a
prepared split under new ids (`<id>-x<copy>`, every id of the cut - cut, supervision, recording -
renamed, so nothing is shared by id); the audio is not copied: every copy points to the source's
audio file by its absolute path. Transcripts, durations and sampling rates are the source's, so
every check, tokenizer and feature of the copies equals the source's.

`replicate_feature_cache` gives the copies the feature cache they would get by computing their
features (identical audio gives identical frames and fingerprints): each source shard once per copy,
its index re-keyed, the frames hard-linked (`link=True`, no disk used) or copied.
`replicate_stream` does the same for a streamed split (asr.data.streaming.stream_shards).
"""
from __future__ import annotations

import gzip
import json
import os
import shutil
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from asr.data.features.feature_cache import SHARD_SUFFIX
from asr.data.corpus.manifests import ManifestError, make_sources_absolute


def copy_id(cut_id: str, copy: int) -> str:
    return f"{cut_id}-x{copy:05d}"


@dataclass
class ScaledSplit:
    """What `write_scaled_cuts` wrote: how many cuts, how many seconds, how many copies of the
    source (the last one possibly partial: its first `last_copy_cuts` cuts)."""

    cuts: int
    seconds: float
    copies: int
    last_copy_cuts: int


def _source_lines(source: Path, audio_root: Path) -> list[tuple[str, str, float]]:
    """(cut id, the cut's JSON with absolute audio paths, duration) of every cut in `source`."""
    lines = []
    with gzip.open(source, "rt", encoding="utf-8") as f:
        for line in f:
            if not line.strip():
                continue
            cut = make_sources_absolute(json.loads(line), audio_root)
            lines.append((cut["id"], json.dumps(cut), float(cut["duration"])))
    if not lines:
        raise ManifestError(f"{source} holds no cuts to scale")
    return lines


def write_scaled_cuts(source: Path, destination: Path, hours: float, audio_root: Path) -> ScaledSplit:
    """Write to `destination` (a .jsonl.gz cut manifest) copies of the cuts of `source` until they
    hold at least `hours` of audio; relative audio paths of `source` are taken relative to `audio_root`."""
    lines = _source_lines(Path(source), Path(audio_root).resolve())
    target = hours * 3600.0
    written, seconds, copy, in_copy = 0, 0.0, 0, 0
    temporary = Path(destination).with_name(Path(destination).name + ".tmp")
    # gzip level 1: the 10,000 h manifest is written in minutes, not tens of them
    with gzip.open(temporary, "wt", encoding="utf-8", compresslevel=1) as f:
        while seconds < target:
            in_copy = 0
            for cut_id, text, duration in lines:
                # every occurrence of the quoted id is an id field (audio paths hold it unquoted)
                f.write(text.replace(f'"{cut_id}"', f'"{copy_id(cut_id, copy)}"'))
                f.write("\n")
                written, seconds, in_copy = written + 1, seconds + duration, in_copy + 1
                if seconds >= target:
                    break
            copy += 1
    os.replace(temporary, destination)
    return ScaledSplit(written, seconds, copy, in_copy)


def replicate_feature_cache(source_directory: Path, destination: Path, scaled: ScaledSplit,
                            source_ids: list[str], link: bool = True) -> int:
    """Fill `destination` (a split's cache folder) with the features of the copies `scaled` describes,
    from `source_directory`, the cache of the source cuts `source_ids` (in manifest order).
    Returns the bytes the cache's frames take (counted per copy, whether linked or copied)."""
    destination = Path(destination)
    destination.mkdir(parents=True, exist_ok=True)
    shards = []
    for index_file in sorted(Path(source_directory).glob("shard-*.json")):
        frames = index_file.with_suffix(SHARD_SUFFIX)
        if frames.is_file():
            shards.append((frames, json.loads(index_file.read_text())))
    last_copy_ids = set(source_ids[:scaled.last_copy_cuts])
    total = 0
    for copy in range(scaled.copies):
        keep = last_copy_ids if copy == scaled.copies - 1 else None
        for frames, entries in shards:
            renamed = {copy_id(cut_id, copy): entry for cut_id, entry in entries.items()
                       if keep is None or cut_id in keep}
            if not renamed:
                continue
            name = destination / f"shard-{time.time_ns():020d}-{uuid.uuid4().hex[:8]}"
            (os.link if link else shutil.copyfile)(frames, name.with_suffix(SHARD_SUFFIX))
            name.with_suffix(".json").write_text(json.dumps(renamed))
            total += frames.stat().st_size
    return total


def replicate_stream(source: Path, destination: Path, hours: float, link: bool = True) -> dict:
    """A streamed split of at least `hours` in `destination` made of copies of the finished stream in
    `source` (asr.data.streaming.stream_shards), as `write_scaled_cuts` makes a manifest: copy c of a cut has
    the id `copy_id(id, c)`; its frames are the source shard's, hard-linked (`link=True`, no disk
    used) or copied; its cut records are rewritten with the new ids. Whole shards are copied, so the
    split holds up to one shard more than `hours`. Resumable: shards already written are kept.
    The index's statistics are the source's (the copies' frames are the source's frames).
    Returns the index."""
    from asr.data.streaming.stream_shards import FORMAT, read_records, shard_name, source_key

    source, destination = Path(source), Path(destination)
    index = json.loads((source / "index.json").read_text())
    if index.get("format") != FORMAT:
        raise ManifestError(f"{source} holds no finished stream of format {FORMAT}")
    destination.mkdir(parents=True, exist_ok=True)
    per_shard_seconds = [json.loads((source / f"{shard_name(s)}.json").read_text())["seconds"]
                         for s in range(index["shards"])]
    shards, seconds = 0, 0.0
    while seconds < hours * 3600.0:
        seconds += per_shard_seconds[shards % index["shards"]]
        shards += 1
    records = [read_records(source, s) for s in range(index["shards"])]
    for shard in range(shards):
        copy, original = divmod(shard, index["shards"])
        name = destination / shard_name(shard)
        if name.with_suffix(".json").is_file():
            continue
        frames = name.with_suffix(SHARD_SUFFIX)
        frames.unlink(missing_ok=True)
        (os.link if link else shutil.copyfile)(source / f"{shard_name(original)}{SHARD_SUFFIX}", frames)
        lines = "".join(json.dumps([copy_id(r[0], copy), *r[1:]], ensure_ascii=False) + "\n" for r in records[original])
        with open(name.with_suffix(".cuts.jsonl.gz"), "wb") as f:
            f.write(gzip.compress(lines.encode(), compresslevel=1))
        summary = json.loads((source / f"{shard_name(original)}.json").read_text())
        name.with_suffix(".json").write_text(json.dumps({**summary, "shard": shard}))
    copies = -(-shards // index["shards"])
    histograms = np.load(source / "histograms.npy")
    np.save(destination / "histograms.npy", np.tile(histograms, (copies, 1))[:shards])
    shutil.copyfile(source / "texts.txt.gz", destination / "texts.txt.gz")
    cuts = sum(len(records[s % index["shards"]]) for s in range(shards))
    scale = cuts / index["cuts"]
    index.update(shards=shards, cuts=cuts, seconds=seconds, frames=int(index["frames"] * scale),
                 manifest=str(destination / "(scaled copies)"), source=source_key(source / "index.json"))
    (destination / "index.json").write_text(json.dumps(index, indent=1))
    return index

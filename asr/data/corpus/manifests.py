"""Reading and checking the lhotse cut manifests that a recipe writes.

A recipe writes `{root}/{corpus}_cuts_{split}.jsonl.gz` (see recipes/*/README.md): MonoCuts with one
supervision each, `supervision.text` (normalised words) and `supervision.custom["phones"]`
(ARPABET_39, space-separated), recordings of 16 kHz mono audio. Audio paths may be absolute or
relative to `root`; relative ones are made absolute here, so the rest of the pipeline never depends
on the working directory.

What is wrong with an utterance falls in two groups:
- problems of the manifest as a whole (file missing, a cut without exactly one supervision, no phones
  field while phone targets are asked for): `ManifestError` at once;
- problems of single utterances (empty transcript, missing/corrupt audio, a sampling rate other than
  16 kHz, too short or too long): found and dealt with in `asr.data.splits.cut_checks`.
"""

from __future__ import annotations

import dataclasses
import math
import os
from pathlib import Path

from lhotse import CutSet
from lhotse.cut import MixedCut

from asr.data.audio.command_sources import CommandNotAllowedError, recording_commands, refuse_command
from asr.data.corpus.corpus_recipes import preparation_hint


# How many offending items an error message lists before it says "and N more".
MAX_LISTED = 20


class ManifestError(ValueError):
    """The manifests (or the audio they point to) cannot be used as they are; the message says why and what to do."""


# The one spelling of a manifest's file name: recipes write, and everything here reads,
# {root}/{corpus}_{kind}_{split}.jsonl.gz with kind recordings, supervisions or cuts.
MANIFEST_NAME = "{corpus}_{kind}_{split}.jsonl.gz"


def manifest_name(corpus: str, kind: str, split: str) -> str:
    """The file name; a `*` or `<split>` in place of a part gives a glob pattern or a message's wording."""
    return MANIFEST_NAME.format(corpus=corpus, kind=kind, split=split)


def manifest_path(root: str | os.PathLike, corpus: str, kind: str, split: str) -> Path:
    return corpus_root(root) / manifest_name(corpus, kind, split)


def cuts_path(root: str | os.PathLike, corpus: str, split: str) -> Path:
    """What the data module reads: the split's cuts (each with its recording and supervision)."""
    return manifest_path(root, corpus, "cuts", split)


def default_root(corpus: str) -> str:
    """Where each recipe writes by default (--out) and each data config reads (data.root)."""
    return f"data/{corpus}"


def corpus_root(root: str | os.PathLike) -> Path:
    """data.root as a folder: `~` expanded; a relative one is relative to the working folder (a
    run's stored one may be elsewhere: asr.evaluation.decoding.evaluation's stored_corpus_folders)."""
    return Path(os.fspath(root)).expanduser()


def listing(items, limit: int = MAX_LISTED) -> str:
    """'a, b, c' or 'a, b, ... and 7 more': error messages name every problem up to a limit."""
    items = list(items)
    shown = ", ".join(str(item) for item in items[:limit])
    return shown + (f", ... and {len(items) - limit} more" if len(items) > limit else "")


def with_absolute_sources(cut, root: Path):
    """The cut with every relative 'file' audio path of its recording joined to root."""
    recording = cut.recording
    if recording is None:
        return cut
    sources = [dataclasses.replace(source, source=str(root / source.source))
               if source.type == "file" and not os.path.isabs(source.source) else source
               for source in recording.sources]
    return dataclasses.replace(cut, recording=dataclasses.replace(recording, sources=sources))


def make_sources_absolute(cut: dict, root: Path) -> dict:
    """with_absolute_sources for a cut as its manifest's JSON dict (changed in place, and returned)."""
    for source in (cut.get("recording") or {}).get("sources", []):
        if source.get("type") == "file" and not os.path.isabs(source["source"]):
            source["source"] = str(root / source["source"])
    return cut


def other_corpora(root: Path, corpus: str, split: str) -> list[str]:
    """The corpus names other than `corpus` that have a `<name>_cuts_<split>.jsonl.gz` in `root`."""
    suffix = manifest_name("", "cuts", split)
    if not root.is_dir():
        return []
    return sorted(path.name[:-len(suffix)] for path in root.glob(manifest_name("*", "cuts", split))
                  if path.name[:-len(suffix)] not in ("", corpus))


def load_cuts(root: str | os.PathLike, corpus: str, split: str, need_phones: bool,
              limit: int | None = None, allow_commands: bool = False) -> CutSet:
    """Read `{root}/{corpus}_cuts_{split}.jsonl.gz` into memory (the first `limit` cuts when given),
    check its structure and make audio paths absolute. A recording whose audio comes from a shell
    command is a ManifestError unless `allow_commands` (data.allow_commands; asr.data.audio.command_sources)."""
    root = corpus_root(root)
    path = cuts_path(root, corpus, split)
    if path.exists() and not path.is_file():   # a folder, a FIFO (reading one would wait forever)
        kind = "a folder" if path.is_dir() else "not a regular file (a FIFO, device or socket)"
        raise ManifestError(f"manifest {path} is {kind}, not a gzipped JSON-lines file of cuts; move it away and "
                            "prepare the corpus again, or point data.root at its manifests")
    if not path.is_file():
        other = other_corpora(root, corpus, split)
        if other:   # the folder holds this split under another corpus name: say which option picks it
            names = " or ".join(f"data.corpus={name}" for name in other)
            raise ManifestError(
                f"manifest {path} not found, but {root} holds manifests of corpus "
                f"{', '.join(repr(name) for name in other)} for split {split!r} "
                f"({', '.join(cuts_path(root, name, split).name for name in other)}), not of corpus {corpus!r}: "
                f"add {names}")
        hint = preparation_hint(corpus, root)
        present = sorted(p.name for p in root.glob(manifest_name("*", "cuts", "*"))) if root.is_dir() else []
        raise ManifestError(
            f"manifest {path} not found (corpus={corpus!r}, split={split!r}); {hint}, or point data.root / "
            f"data.corpus / data.*_split at existing manifests" + (f" (found: {', '.join(present)})" if present else ""))
    # One pass over the file, checking each cut as it is read and keeping only its absolute-path
    # copy: at 1,000 h a second copy of the cuts would be another ~1 GB (asr/RESULTS.md, "Scale").
    cuts, not_one, no_audio, no_phones, bad_times = [], [], [], [], []
    try:
        for cut in CutSet.from_jsonl_lazy(path):
            if len(cut.supervisions) != 1:
                not_one.append(cut.id)
            if not seconds_are_valid(cut):
                bad_times.append(cut.id)
            for command in recording_commands(getattr(cut, "recording", None)):
                refuse_command(path, f"cut {cut.id}", command, allow_commands)
            if not cut.has_recording:
                no_audio.append(cut.id)
            elif need_phones and len(cut.supervisions) == 1 and "phones" not in (cut.supervisions[0].custom or {}):
                no_phones.append(cut.id)
            cuts.append(with_absolute_sources(cut, root))
            if limit is not None and len(cuts) >= limit:
                break
    except CommandNotAllowedError as error:
        raise ManifestError(str(error)) from None
    except Exception as error:  # lhotse raises many types for a malformed manifest
        raise ManifestError(f"cannot read manifest {path}: {type(error).__name__}: {error}") from error
    if not cuts:
        raise ManifestError(f"manifest {path} holds no cuts; regenerate it with its recipe")
    if bad_times:   # NaN passed every comparison of the checks after this one, and failed deep in batching
        raise ManifestError(f"{path}: the start or duration of these cuts (or of their recordings) is not a finite "
                            f"number of seconds >= 0: {listing(bad_times)}; fix them or regenerate the manifest "
                            "with its recipe")
    if not_one:
        raise ManifestError(f"{path}: every cut must carry exactly one supervision (the utterance's "
                            f"transcript); these do not: {listing(not_one)}")
    if no_audio:
        raise ManifestError(f"{path}: cuts without a recording: {listing(no_audio)}")
    if no_phones:
        raise ManifestError(f"{path}: phone targets are configured (data.targets) but these cuts have no "
                            f"supervision.custom['phones']: {listing(no_phones)}; remove 'phones' from "
                            "data.targets or regenerate the manifests with phones")
    return CutSet.from_cuts(cuts)


def seconds_are_valid(cut) -> bool:
    """Whether a cut's start and duration, and its recording's duration, are finite and >= 0."""
    times = [cut.start, cut.duration]
    if getattr(cut, "has_recording", False):
        times.append(cut.recording.duration)
    try:
        return all(math.isfinite(value) and value >= 0 for value in map(float, times))
    except (TypeError, ValueError):
        return False


class StreamCut:
    """One utterance of a streamed split (asr.data.streaming.stream_shards): what a batch needs, nothing else
    (~0.9 KB in memory, where a lhotse cut takes ~2.7 KB)."""

    __slots__ = ("id", "duration", "num_frames", "offset", "length", "text", "phones", "shard")

    def __init__(self, record: list, shard: int):
        self.id, self.duration, self.num_frames, self.offset, self.length, self.text, self.phones = record
        self.shard = shard

    def transcript(self, field: str) -> str:
        return self.text if field == "text" else self.phones


def transcript(cut, field: str) -> str:
    """The supervision field a tokenizer reads: 'text' (words) or 'phones'. A joined training example
    (a MixedCut, asr.data.batching.joined_examples) reads its utterances' fields joined with a space."""
    if isinstance(cut, StreamCut):
        return cut.transcript(field)
    if isinstance(cut, MixedCut):
        return " ".join(transcript(track.cut, field) for track in cut.tracks)
    supervision = cut.supervisions[0]
    if field == "text":
        return supervision.text or ""
    return (supervision.custom or {}).get("phones") or ""

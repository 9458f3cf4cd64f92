"""From a corpus recipe's list of recordings and utterances to the manifests every recipe writes,
with the audio conversion, the problem report and resumption they all share.

A recipe (recipes/<corpus>/prepare.py) reads its corpus layout and calls `build_manifests` with

- `RecordingSpec`s: where each recording's audio is (a file or a Kaldi pipe, a channel);
- `UtteranceSpec`s: split, recording, time span, speaker, normalised words, phones;
- `Problem`s it found itself (a transcript with no audio, words missing from the lexicon, ...).

What this module does with them:

Audio. Every recording is converted once to 16 kHz mono 16-bit FLAC at `<out>/audio/<id>.flac`
(SPHERE, shorten, mu-law, 8 kHz telephone sides, Kaldi pipes all end up in the one format DATA
reads without external tools). The exception is audio that already is 16 kHz mono and readable by
libsndfile, offered with `reference_if_compatible=True` (LibriSpeech's FLAC): the manifest points at
the original file instead of copying hundreds of gigabytes. Audio under `<out>` is referenced by a
path relative to `<out>` (the folder can be moved; asr.data.corpus.manifests resolves it), original files
outside it by absolute paths.

Resumption. A converted file is written under a temporary name and renamed when complete, so a
file that exists is whole; a re-run converts only what is missing. When the report of a previous
run says "complete" with the same settings and all manifests exist, nothing is redone.

Problems. Each problem kind follows a policy, "error" or "drop": `oov` (words missing from the
lexicon) follows `oov_policy`; missing or unreadable audio, missing transcripts or speakers and
segments outside their recording follow `bad_data_policy`. With any "error" problem, the run still
converts all good audio (so the re-run after a fix is quick), writes the report listing every
problem, writes no manifests, and raises `PreparationError` naming the report, the counts and
the option that would drop them instead. With "drop", the utterances are left out and counted.

Left out by the recipe's own rules. A recipe that leaves utterances out on purpose (a transcript
whose spoken form it cannot know, a one-word prompt) passes them as `left_out` Problems: counted by
kind and listed with the problems, never stopping the preparation, never converted.
"""

from __future__ import annotations

import os
import re
from collections import Counter, defaultdict
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from math import gcd
from pathlib import Path
from typing import Iterable

import numpy as np
import soundfile
from lhotse import CutSet, MonoCut, Recording, RecordingSet, SupervisionSegment, SupervisionSet
from lhotse.audio import AudioSource as LhotseAudioSource
from tqdm.auto import tqdm

from asr.data.audio.audio_source import AudioSource, AudioSourceError, check_regular_file
from asr.data.corpus.manifests import manifest_path
from asr.data.corpus.preparation_report import (Problem, build_report, failure_message, ordered_splits, report_path,
                                                write_json)

SAMPLE_RATE = 16000
_SPLIT_NAME = re.compile(r"^[a-z0-9_]+$")
POLICIES = ("error", "drop")
# A segment may end this far past its recording (transcript times are rounded); it is clipped.
SEGMENT_END_TOLERANCE = 0.05


class PreparationError(RuntimeError):
    """Preparation stopped on problems whose policy is 'error'; the message says where the report is."""


class NoUtterancesError(ValueError):
    """The corpus folder holds none of the utterances the recipe reads (a usage error: a wrong folder)."""


@dataclass(frozen=True)
class RecordingSpec:
    id: str
    source: AudioSource
    reference_if_compatible: bool = False


@dataclass(frozen=True)
class UtteranceSpec:
    id: str
    split: str
    recording_id: str
    speaker: str
    text: str  # normalised words (text_normalisation.py)
    start: float = 0.0
    end: float | None = None  # None: the end of the recording
    phones: str | None = None  # space-separated phone targets, when the corpus has them
    oov_words: tuple[str, ...] = ()  # tokens the lexicon could not pronounce


# Utterances whose transcript holds no words (only noise marks) cannot be CTC targets: always left
# out, and counted in the report.
ALWAYS_DROPPED = frozenset({"empty_transcript"})


def problem_policy_option(kind: str) -> str | None:
    if kind in ALWAYS_DROPPED:
        return None
    return "oov_policy" if kind == "oov" else "bad_data_policy"


def build_manifests(
    corpus: str,
    out_dir: str | Path,
    recordings: Iterable[RecordingSpec],
    utterances: Iterable[UtteranceSpec],
    problems: Iterable[Problem] = (),
    *,
    settings: dict,
    left_out: Iterable[Problem] = (),
    oov_policy: str = "error",
    bad_data_policy: str = "error",
    phone_set: str | None = None,
    jobs: int | None = None,
    progress: bool = True,
) -> dict:
    """Convert audio, check, and write `{corpus}_{recordings,supervisions,cuts}_{split}.jsonl.gz`.

    Returns the report (also written to `{corpus}_report.json`); raises PreparationError when a
    problem's policy is "error". `left_out`: utterances the recipe leaves out by its own rules, one
    Problem each (kind = the reason), reported with the problems but never stopping. `phone_set`
    ("arpabet39", "timit61") is stored beside the phones of every supervision so that a reader
    knows their inventory.
    """
    for name, policy in (("oov_policy", oov_policy), ("bad_data_policy", bad_data_policy)):
        if policy not in POLICIES:
            raise ValueError(f"{name}={policy!r}: must be one of {POLICIES}")
    out_dir = Path(out_dir).resolve()
    recordings = {spec.id: spec for spec in recordings}
    utterances = list(utterances)
    problems = list(problems)
    left_out = list(left_out)
    if not utterances and not problems:     # before anything is written: a wrong folder leaves nothing behind
        folder = (settings.get("corpus_dir") or settings.get("data_dir")
                  or ", ".join(settings.get("corpus_dirs", [])) or "the corpus folder")
        raise NoUtterancesError(f"{folder}: no {corpus} utterances found in it; point the recipe at the corpus "
                                "folder its README describes")
    audio_dir = out_dir / "audio"
    audio_dir.mkdir(parents=True, exist_ok=True)
    for utterance in utterances:
        if not _SPLIT_NAME.match(utterance.split):
            raise ValueError(f"utterance {utterance.id}: split {utterance.split!r} must be lowercase a-z, 0-9, _")

    converted, failed = _convert_recordings(corpus, recordings, utterances, audio_dir, out_dir, jobs, progress)
    problems += failed.values()
    kept = _usable_utterances(utterances, recordings, converted, failed, problems)

    policies = {"oov_policy": oov_policy, "bad_data_policy": bad_data_policy, None: "drop"}
    stopping = [p for p in problems if policies[problem_policy_option(p.kind)] == "error"]
    oov_counts = Counter(word for u in utterances for word in u.oov_words)
    report = build_report(corpus, settings, problems + left_out, kept, oov_counts, out_dir,
                          status="failed" if stopping else "complete")
    report["dropped_utterances"] = len(utterances) - len(kept) + len(left_out)
    if stopping:
        write_json(report_path(out_dir, corpus), report)
        raise PreparationError(failure_message(corpus, stopping, out_dir))

    _write_splits(corpus, out_dir, kept, phone_set)
    write_json(report_path(out_dir, corpus), report)
    return report


def _convert_recordings(corpus: str, recordings: dict[str, RecordingSpec], utterances: list[UtteranceSpec],
                        audio_dir: Path, out_dir: Path, jobs: int | None, progress: bool
                        ) -> tuple[dict[str, Recording], dict[str, Problem]]:
    """Every recording some utterance uses, converted (or referenced) once: (converted, failed)."""
    needed = sorted({u.recording_id for u in utterances if u.recording_id in recordings})
    converted: dict[str, Recording] = {}
    failed: dict[str, Problem] = {}
    with ThreadPoolExecutor(max_workers=max(1, jobs or min(4, os.cpu_count() or 1))) as pool:
        results = pool.map(lambda rid: _prepare_recording(recordings[rid], audio_dir, out_dir), needed)
        for recording_id, result in tqdm(
            zip(needed, results), total=len(needed), desc=f"{corpus}: audio", unit="rec", disable=not progress
        ):
            if isinstance(result, Problem):
                failed[recording_id] = result
            else:
                converted[recording_id] = result
    return converted, failed


def _usable_utterances(utterances: list[UtteranceSpec], recordings: dict[str, RecordingSpec],
                       converted: dict[str, Recording], failed: dict[str, Problem], problems: list[Problem]
                       ) -> list[tuple[UtteranceSpec, Recording, float, float]]:
    """The utterances whose audio, segment and words are all usable, with their recording and
    segment; a Problem appended to `problems` for each of the others."""
    kept: list[tuple[UtteranceSpec, Recording, float, float]] = []
    for utterance in utterances:
        if utterance.recording_id not in recordings:
            problems.append(Problem("missing_audio", utterance.id, f"{utterance.id}: no audio for recording {utterance.recording_id}"))
            continue
        if utterance.recording_id in failed:
            continue  # the recording's problem is reported once, not once per utterance
        if not utterance.text.strip():
            problems.append(Problem("empty_transcript", utterance.id, f"{utterance.id}: no words left in its transcript"))
            continue
        if utterance.oov_words:
            problems.append(
                Problem("oov", utterance.id, f"{utterance.id}: not in the lexicon: {' '.join(utterance.oov_words)}")
            )
            continue
        recording = converted[utterance.recording_id]
        start = utterance.start
        end = recording.duration if utterance.end is None else utterance.end
        if end > recording.duration and end - recording.duration <= SEGMENT_END_TOLERANCE:
            end = recording.duration
        if not 0 <= start < end <= recording.duration:
            problems.append(
                Problem(
                    "bad_segment",
                    utterance.id,
                    f"{utterance.id}: segment {start:.3f}-{end:.3f} s is outside recording "
                    f"{recording.id} ({recording.duration:.3f} s)",
                )
            )
            continue
        kept.append((utterance, recording, start, end))
    return kept


def _prepare_recording(spec: RecordingSpec, audio_dir: Path, out_dir: Path) -> Recording | Problem:
    """Convert one recording to 16 kHz mono FLAC (or reference it) -> its lhotse Recording."""
    try:
        if spec.reference_if_compatible and spec.source.path is not None:
            referenced = _reference_if_compatible(spec)
            if referenced is not None:
                return referenced
        target = audio_dir / f"{spec.id}.flac"
        if target.is_file():  # converted by an earlier run (written atomically, so complete)
            return _recording(spec.id, target.relative_to(out_dir), soundfile.info(str(target)).frames)
        samples, rate = spec.source.load()
        if samples.size == 0:
            raise AudioSourceError(f"{spec.source.describe()}: no samples")
        samples = resample_int16(samples, rate, SAMPLE_RATE)
        partial = target.with_name(target.name + ".partial")
        soundfile.write(str(partial), samples, SAMPLE_RATE, subtype="PCM_16", format="FLAC")
        os.replace(partial, target)
        return _recording(spec.id, target.relative_to(out_dir), samples.size)
    except AudioSourceError as error:
        return Problem(error.kind, spec.id, f"{spec.id}: {error}")


def _reference_if_compatible(spec: RecordingSpec) -> Recording | None:
    path = Path(spec.source.path)
    check_regular_file(path)
    try:
        info = soundfile.info(str(path))
    except (RuntimeError, soundfile.LibsndfileError) as error:
        raise AudioSourceError(f"{path}: unreadable audio ({error})") from None
    if info.samplerate != SAMPLE_RATE or info.channels != 1 or info.frames == 0:
        return None  # not usable as is: convert it like any other source
    return _recording(spec.id, path.resolve(), info.frames)


def _recording(recording_id: str, path: Path, num_samples: int) -> Recording:
    return Recording(
        id=recording_id,
        sources=[LhotseAudioSource(type="file", channels=[0], source=str(path))],
        sampling_rate=SAMPLE_RATE,
        num_samples=num_samples,
        duration=num_samples / SAMPLE_RATE,
    )


def resample_int16(samples: np.ndarray, rate: int, target_rate: int) -> np.ndarray:
    """Polyphase resampling (scipy's Kaiser-windowed FIR) of int16 samples, rounded back to int16."""
    if rate == target_rate:
        return samples.astype(np.int16, copy=False)
    from scipy.signal import resample_poly

    common = gcd(rate, target_rate)
    resampled = resample_poly(samples.astype(np.float64), target_rate // common, rate // common)
    return np.clip(np.round(resampled), -32768, 32767).astype(np.int16)


def _write_splits(corpus: str, out_dir: Path, kept: list, phone_set: str | None) -> None:
    """The manifests of every split that kept utterances."""
    by_split: dict[str, list] = defaultdict(list)
    for item in kept:
        by_split[item[0].split].append(item)
    for split in ordered_splits(by_split):
        _write_split(corpus, out_dir, split, by_split[split], phone_set)


def _write_split(corpus: str, out_dir: Path, split: str, items: list, phone_set: str | None) -> None:
    recordings = {}
    supervisions = []
    cuts = []
    for utterance, recording, start, end in sorted(items, key=lambda item: item[0].id):
        recordings[recording.id] = recording
        custom = None
        if utterance.phones is not None:
            custom = {"phones": utterance.phones}
            if phone_set is not None:
                custom["phone_set"] = phone_set
        supervision = SupervisionSegment(
            id=utterance.id,
            recording_id=recording.id,
            start=start,
            duration=end - start,
            channel=0,
            text=utterance.text,
            speaker=utterance.speaker,
            language="English",
            custom=custom,
        )
        supervisions.append(supervision)
        cut_supervision = SupervisionSegment(**{**supervision.to_dict(), "start": 0.0})
        cuts.append(
            MonoCut(id=utterance.id, start=start, duration=end - start, channel=0, recording=recording,
                    supervisions=[cut_supervision])
        )
    # Each file is written under a temporary name and renamed, so an existing manifest is whole.
    for kind, manifest in (
        ("recordings", RecordingSet.from_recordings(recordings.values())),
        ("supervisions", SupervisionSet.from_segments(supervisions)),
        ("cuts", CutSet.from_cuts(cuts)),
    ):
        path = manifest_path(out_dir, corpus, kind, split)
        partial = path.with_name(path.name.replace(".jsonl.gz", ".partial.jsonl.gz"))
        manifest.to_file(partial)
        os.replace(partial, path)


def file_identity(path: str | Path) -> dict:
    """A file's path, size and modification time, for settings: a changed lexicon means new targets."""
    path = Path(path).resolve()
    stat = path.stat() if path.is_file() else None
    return {"path": str(path), "size": stat.st_size if stat else None, "mtime_ns": stat.st_mtime_ns if stat else None}



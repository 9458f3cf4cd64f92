"""Long test recordings: a corpus split's utterances, in manifest order, joined with short pauses
into recordings of 1, 10, 30 and 60 minutes, each a Kaldi folder any asr command reads.

    python -m recipes.longform.prepare                                  # data/synth test: 1 10 30 60 min
    python -m recipes.longform.prepare --split dev test --minutes 1 10 30 60
    python -m recipes.longform.prepare --corpus asterisk --split dev test --minutes 1 5 --longer-than-split refuse

Writes `<out>/<corpus>_<split>/<minutes>min/` (asr.data.corpus.long_recordings describes the files): the
audio (recording.wav), wav.scp / text / utt2spk (one utterance: the whole recording), and
references.json (per joined utterance its boundaries and its words and phone reference). A length
longer than the split goes round the split again (`--longer-than-split repeat`, the default) or is
refused before anything is written (`refuse`); README.md says why.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import soundfile
from tqdm.auto import tqdm

from asr.core.exit_status import run_command
from asr.data.corpus.long_recordings import (AUDIO_NAME, DEFAULT_OUT, REFERENCES_NAME, SETTINGS_NAME, JoinedUtterance,
                                             LongRecording, length_folder, recording_id, set_folder, write_references)
from asr.data.corpus.manifests import ManifestError, cuts_path, default_root, load_cuts

LONGER_THAN_SPLIT = ("repeat", "refuse")
SAMPLE_FORMATS = {"int16": "PCM_16", "float": "FLOAT"}
LAYOUT_VERSION = 1      # bump when what a folder holds changes, so reruns rebuild


class LongformError(ValueError):
    """A usage error: an option, or a split too short for a length under --longer-than-split refuse."""


@dataclass(frozen=True)
class SourceUtterance:
    """What joining needs of a manifest cut (the cut itself is kept to load its audio)."""
    cut: object
    num_samples: int
    text: str
    phones: str


def read_split(root: Path, corpus: str, split: str) -> tuple[list[SourceUtterance], int, str | None]:
    """The split's utterances in manifest order, their sample rate and phone set."""
    cuts = list(load_cuts(root, corpus, split, need_phones=False))
    rates = sorted({cut.sampling_rate for cut in cuts})
    if len(rates) != 1:
        raise LongformError(f"{cuts_path(root, corpus, split)} mixes sample rates {rates}; a recording has one")
    utterances = []
    phone_set = None
    for cut in cuts:
        supervision = cut.supervisions[0]
        custom = supervision.custom or {}
        phone_set = phone_set or custom.get("phone_set")
        utterances.append(SourceUtterance(cut, cut.num_samples, " ".join((supervision.text or "").split()),
                                          " ".join((custom.get("phones") or "").split())))
    return utterances, rates[0], phone_set


def plan(utterances: list[SourceUtterance], target_samples: int, pause_samples: int) -> list[tuple[int, int]]:
    """(utterance index, pass) in order: utterances are added until the recording (utterances and
    the pauses between them) is at least target_samples long, going round the split again if it
    must (check_lengths has refused that where it is not wanted)."""
    chosen, total = [], 0
    while total < target_samples:
        index = len(chosen) % len(utterances)
        total += (pause_samples if chosen else 0) + utterances[index].num_samples
        chosen.append((index, len(chosen) // len(utterances)))
    return chosen


def split_samples(utterances: list[SourceUtterance], pause_samples: int) -> int:
    return sum(u.num_samples for u in utterances) + pause_samples * (len(utterances) - 1)


def check_lengths(minutes: list[float], utterances: list[SourceUtterance], rate: int, pause_samples: int,
                  longer_than_split: str, where: str) -> None:
    """LongformError, before anything is built, for a length the split cannot give without repeating
    itself when that is refused."""
    available = split_samples(utterances, pause_samples) / rate / 60
    too_long = [m for m in minutes if m * 60 * rate > split_samples(utterances, pause_samples)]
    if too_long and longer_than_split == "refuse":
        raise LongformError(
            f"{where} holds {available:.2f} minutes ({len(utterances)} utterances with their pauses), shorter than "
            f"{', '.join(f'{m:g}' for m in too_long)} minutes; choose --minutes up to {available:.2f}, or "
            f"--longer-than-split repeat (go round the split again, in the same order)")


def to_samples(audio: np.ndarray, sample_format: str) -> np.ndarray:
    """A cut's float audio (channels, samples) -> mono in the WAV's sample type. 16-bit sources read
    as int / 32768 come back as the same integers."""
    mono = audio.mean(axis=0) if audio.ndim == 2 else audio
    if sample_format == "float":
        return mono.astype(np.float32)
    return np.clip(np.round(mono.astype(np.float64) * 32768.0), -32768, 32767).astype(np.int16)


def write_recording(folder: Path, identifier: str, utterances: list[SourceUtterance], chosen: list[tuple[int, int]],
                    rate: int, pause_samples: int, pause: float, phone_set: str | None, sample_format: str,
                    bar) -> LongRecording:
    """Streams the chosen utterances and pauses into folder/recording.wav (under a temporary name
    until complete) and returns what was placed where."""
    partial = folder / (AUDIO_NAME + ".partial")
    silence = np.zeros(pause_samples, dtype=np.int16 if sample_format == "int16" else np.float32)
    joined, position = [], 0
    with soundfile.SoundFile(str(partial), "w", samplerate=rate, channels=1, format="WAV",
                             subtype=SAMPLE_FORMATS[sample_format]) as out:
        for index, passed in chosen:
            source = utterances[index]
            if joined:
                out.write(silence)
                position += pause_samples
            samples = to_samples(source.cut.load_audio(), sample_format)
            out.write(samples)
            cut_id = source.cut.id
            joined.append(JoinedUtterance(id=cut_id if passed == 0 else f"{cut_id}#{passed}", source_id=cut_id,
                                          start_sample=position, num_samples=len(samples), start=position / rate,
                                          end=(position + len(samples)) / rate, text=source.text,
                                          phones=source.phones))
            position += len(samples)
            bar.update(len(samples) / rate)
    partial.replace(folder / AUDIO_NAME)
    return LongRecording(folder, identifier, rate, position, pause, phone_set, 1 + max(p for _, p in chosen), joined)


def write_kaldi_files(recording: LongRecording) -> None:
    folder = recording.folder
    (folder / "wav.scp").write_text(f"{recording.recording_id} {recording.audio_path.resolve()}\n")
    (folder / "text").write_text(f"{recording.recording_id} {recording.joined_words()}\n")
    (folder / "utt2spk").write_text(f"{recording.recording_id} {recording.recording_id}\n")


def build_settings(root: Path, corpus: str, split: str, minutes: float, pause: float, longer_than_split: str,
                   sample_format: str) -> dict:
    manifest = cuts_path(root, corpus, split)
    status = manifest.stat()
    return {"version": LAYOUT_VERSION, "corpus": corpus, "split": split, "manifest": str(manifest.resolve()),
            "manifest_size": status.st_size, "manifest_mtime_ns": status.st_mtime_ns, "minutes": minutes,
            "pause_seconds": pause, "longer_than_split": longer_than_split, "sample_format": sample_format}


def is_built(folder: Path, settings: dict) -> bool:
    try:
        return (json.loads((folder / SETTINGS_NAME).read_text()) == settings and (folder / AUDIO_NAME).is_file()
                and (folder / REFERENCES_NAME).is_file())
    except (OSError, ValueError):
        return False


def build_long_recordings(corpus: str = "synth", splits: tuple[str, ...] = ("test",), minutes=(1, 10, 30, 60),
                          root: str | os.PathLike | None = None, out: str | os.PathLike = DEFAULT_OUT,
                          pause: float = 0.4, longer_than_split: str = "repeat", sample_format: str = "int16",
                          progress: bool = True) -> list[dict]:
    """Builds (or finds up to date) one recording per split x length; returns a summary row for each."""
    if longer_than_split not in LONGER_THAN_SPLIT:
        raise LongformError(f"longer_than_split={longer_than_split!r}; choose {' or '.join(LONGER_THAN_SPLIT)}")
    if sample_format not in SAMPLE_FORMATS:
        raise LongformError(f"sample_format={sample_format!r}; choose {' or '.join(SAMPLE_FORMATS)}")
    if not pause >= 0:
        raise LongformError(f"--pause {pause}: give seconds, 0 or more")
    minutes = sorted(dict.fromkeys(float(m) for m in minutes))
    if not minutes or minutes[0] <= 0:
        raise LongformError("--minutes: give one or more lengths in minutes, each above 0 (e.g. 1 10 30 60)")
    root = Path(root if root is not None else default_root(corpus)).expanduser()
    read = {split: read_split(root, corpus, split) for split in dict.fromkeys(splits)}
    for split, (utterances, rate, _) in read.items():   # every refusal before anything is written
        check_lengths(minutes, utterances, rate, round(pause * rate), longer_than_split, f"{corpus} {split} ({root})")
    rows = []
    for split, (utterances, rate, phone_set) in read.items():
        pause_samples = round(pause * rate)
        for length in minutes:
            folder = length_folder(set_folder(out, corpus, split), length)
            settings = build_settings(root, corpus, split, length, pause, longer_than_split, sample_format)
            chosen = plan(utterances, round(length * 60 * rate), pause_samples)
            row = {"set": str(folder), "minutes": length, "utterances": len(chosen),
                   "passes": 1 + max(p for _, p in chosen)}
            if is_built(folder, settings):
                row.update(seconds=json.loads((folder / REFERENCES_NAME).read_text())["duration"], status="up to date")
                rows.append(row)
                continue
            folder.mkdir(parents=True, exist_ok=True)
            (folder / SETTINGS_NAME).unlink(missing_ok=True)      # written last: its presence means complete
            planned = (sum(utterances[i].num_samples for i, _ in chosen) + pause_samples * (len(chosen) - 1)) / rate
            with tqdm(total=round(planned, 1), unit="s", desc=f"{corpus} {split} {length:g} min",
                      disable=not progress, leave=False) as bar:
                recording = write_recording(folder, recording_id(corpus, split, length), utterances, chosen, rate,
                                            pause_samples, pause, phone_set, sample_format, bar)
            write_kaldi_files(recording)
            write_references(recording, folder / REFERENCES_NAME)
            (folder / SETTINGS_NAME).write_text(json.dumps(settings, indent=1) + "\n")
            row.update(seconds=recording.duration, status="built")
            rows.append(row)
    return rows


def format_summary(rows: list[dict]) -> str:
    lines = ["| folder | minutes | length | utterances | passes over the split | |", "|---|---:|---:|---:|---:|---|"]
    for row in rows:
        lines.append(f"| {row['set']} | {row['minutes']:g} | {row['seconds'] / 60:.2f} min | {row['utterances']} | "
                     f"{row['passes']} | {row['status']} |")
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    parser.add_argument("--corpus", default="synth", help="the corpus's manifest name (default synth)")
    parser.add_argument("--root", default=None, help="its manifest folder (default data/<corpus>)")
    parser.add_argument("--split", nargs="+", default=["test"], help="splits to join (default test; e.g. dev test)")
    parser.add_argument("--minutes", nargs="+", type=float, default=[1, 10, 30, 60],
                        help="recording lengths in minutes (default 1 10 30 60)")
    parser.add_argument("--pause", type=float, default=0.4, help="seconds of silence between utterances (default 0.4)")
    parser.add_argument("--out", default=DEFAULT_OUT, help=f"where the sets go (default {DEFAULT_OUT})")
    parser.add_argument("--longer-than-split", choices=LONGER_THAN_SPLIT, default="repeat",
                        help="a length longer than the split: go round it again (default) or refuse")
    parser.add_argument("--sample-format", choices=list(SAMPLE_FORMATS), default="int16",
                        help="WAV samples: int16 (default; exact for the corpora's 16-bit audio) or float")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")
    args = parser.parse_args(argv)

    def body():
        rows = build_long_recordings(args.corpus, tuple(args.split), args.minutes, args.root, args.out, args.pause,
                                     args.longer_than_split, args.sample_format, progress=not args.no_progress)
        print(format_summary(rows))

    return run_command("recipes.longform.prepare", body, usage_errors=(LongformError, ManifestError),
                       resume_hint="run the same command again: finished lengths are kept")


if __name__ == "__main__":
    sys.exit(main())

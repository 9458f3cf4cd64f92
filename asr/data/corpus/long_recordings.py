"""Long test recordings: a corpus split's utterances joined into one recording, as a Kaldi folder.

recipes/longform writes them and asr.benchmarks.longform reads them; the layout is defined here
once (asr never imports recipes). A set is `<out>/<corpus>_<split>/` with one folder per length,
`<minutes>min/` (`length_folder`), holding

    recording.wav      the joined audio (16-bit or float WAV at the corpus's rate)
    wav.scp text utt2spk   a Kaldi folder of one utterance, the whole recording (asr.evaluate data_dir=)
    references.json    what a scorer needs: per joined utterance its id, boundaries (seconds and
                       samples), words and phone reference (the manifest's supervision.custom["phones"],
                       what the utterance-level evaluation scores against), and the phone set
    settings.json      what built it (a rerun with the same settings does nothing)

`joined_phones` / `joined_words` give the references a whole-recording hypothesis is scored against
(asr.text.metrics.phone_error_rate on the one pair, as asr.evaluate scores a split).
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

AUDIO_NAME = "recording.wav"
REFERENCES_NAME = "references.json"
SETTINGS_NAME = "settings.json"
DEFAULT_OUT = "data/longform"


class LongRecordingError(ValueError):
    """A long recording's folder that is missing or incomplete; the message says how to build it."""


def set_folder(out: str | Path, corpus: str, split: str) -> Path:
    return Path(out) / f"{corpus}_{split}"


def minutes_label(minutes: float) -> str:
    """10 -> '10min', 0.5 -> '0.5min': a length's folder name and recording id part."""
    return f"{minutes:g}min"


def length_folder(set_dir: str | Path, minutes: float) -> Path:
    return Path(set_dir) / minutes_label(minutes)


def recording_id(corpus: str, split: str, minutes: float) -> str:
    return f"{corpus}_{split}_{minutes_label(minutes)}"


@dataclass(frozen=True)
class JoinedUtterance:
    id: str                  # unique in the recording: the source utterance's id, with '#<pass>' after the first pass
    source_id: str           # the utterance (cut) id in the corpus manifest
    start_sample: int        # where its audio begins in recording.wav
    num_samples: int
    start: float             # seconds (start_sample / sample_rate)
    end: float
    text: str
    phones: str              # "" when the corpus has no phone targets


@dataclass(frozen=True)
class LongRecording:
    folder: Path
    recording_id: str
    sample_rate: int
    num_samples: int
    pause_seconds: float
    phone_set: str | None
    passes: int              # times the split was gone through (more than 1: --longer-than-split repeat)
    utterances: list[JoinedUtterance]

    @property
    def audio_path(self) -> Path:
        return self.folder / AUDIO_NAME

    @property
    def duration(self) -> float:
        return self.num_samples / self.sample_rate

    def joined_phones(self) -> str:
        return " ".join(u.phones for u in self.utterances if u.phones.strip())

    def joined_words(self) -> str:
        return " ".join(u.text for u in self.utterances if u.text.strip())


def write_references(recording: LongRecording, path: Path) -> None:
    document = {"recording_id": recording.recording_id, "sample_rate": recording.sample_rate,
                "num_samples": recording.num_samples, "duration": recording.duration,
                "pause_seconds": recording.pause_seconds, "phone_set": recording.phone_set,
                "passes": recording.passes,
                "utterances": [u.__dict__ for u in recording.utterances]}
    path.write_text(json.dumps(document, indent=1) + "\n")


def read_long_recording(folder: str | Path, build_command: str = "python -m recipes.longform.prepare") -> LongRecording:
    """The long recording in `folder`; LongRecordingError naming `build_command` when it is not there."""
    folder = Path(folder)
    references = folder / REFERENCES_NAME
    if not references.is_file() or not (folder / AUDIO_NAME).is_file():
        raise LongRecordingError(f"long test recording {folder} not found (no {REFERENCES_NAME} and {AUDIO_NAME} "
                                 f"there); build it with `{build_command}`")
    try:
        document = json.loads(references.read_text())
        utterances = [JoinedUtterance(**u) for u in document["utterances"]]
        return LongRecording(folder, document["recording_id"], int(document["sample_rate"]),
                             int(document["num_samples"]), float(document["pause_seconds"]), document["phone_set"],
                             int(document["passes"]), utterances)
    except (ValueError, KeyError, TypeError) as error:
        raise LongRecordingError(f"{references} is not a long recording's references file ({error}); rebuild it "
                                 f"with `{build_command}`") from None

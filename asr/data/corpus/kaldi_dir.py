"""Kaldi data directories: wav.scp, text, utt2spk and optionally segments.

    wav.scp   <recording-id> <path>                       or   <recording-id> <command> |
    text      <utterance-id> <word> <word> ...
    utt2spk   <utterance-id> <speaker-id>
    segments  <utterance-id> <recording-id> <start-seconds> <end-seconds>   (optional)

Without `segments` an utterance is a whole recording with the same id (Kaldi's convention).
Inconsistencies between the files (an utterance without audio, audio without a transcript) are
collected as problems for the preparation report rather than raised one by one, so a user sees
all of them at once. What is wrong within one file stops the reading with a KaldiDataDirError naming
the file and line: a line that is not UTF-8 or holds a control character (a NUL, an escape), an id
given twice (the second line would silently replace the first), a segment that is not in seconds.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from pathlib import Path

from asr.data.audio.audio_source import AudioSource
from asr.data.audio.command_sources import CommandNotAllowedError, refuse_command


class KaldiDataDirError(ValueError):
    """A data directory that is missing, or a file in it that is not in Kaldi's format."""


@dataclass(frozen=True)
class KaldiUtterance:
    id: str
    recording_id: str
    words: tuple[str, ...]
    speaker: str
    start: float = 0.0
    end: float | None = None  # None: to the end of the recording


@dataclass
class KaldiDataDir:
    path: Path
    recordings: dict[str, AudioSource]
    utterances: list[KaldiUtterance]
    problems: list[tuple[str, str, str]] = field(default_factory=list)  # (kind, item, message)


def parse_wav_scp_value(value: str) -> AudioSource:
    """'/a/b.wav' -> a file; 'sph2pipe -f wav /a/b.wv1 |' -> a command (Kaldi's pipe syntax)."""
    value = value.strip()
    if value.endswith("|"):
        return AudioSource(command=value[:-1].strip())
    return AudioSource(path=value)


def read_kaldi_table(path: Path, min_fields: int = 2, key: str = "utterance id") -> list[tuple[int, list[str]]]:
    """Lines of a Kaldi table as (line number, [key, value...]); blank lines skipped.

    A line that is not UTF-8 or holds a control character (NUL, escape, ...: anything but tab and the
    line end) is a KaldiDataDirError naming the file and line, as is a `key` (the first field) given on
    two lines: decoded leniently they would become word breaks in a reference, and a second line would
    silently replace the first."""
    rows = []
    first_line: dict[str, int] = {}
    with open(path, "rb") as handle:
        for number, raw in enumerate(handle, start=1):
            line = _decoded_line(path, number, raw)
            if not line.strip():
                continue
            fields = line.split(None, 1) if min_fields == 2 else line.split()
            if len(fields) < min_fields:
                raise KaldiDataDirError(f"{path}:{number}: expected at least {min_fields} fields, got {line.strip()!r}")
            if fields[0] in first_line:
                raise KaldiDataDirError(f"{path}:{number}: {key} {fields[0]!r} is also on line "
                                        f"{first_line[fields[0]]}; each {key} may be given once")
            first_line[fields[0]] = number
            rows.append((number, fields))
    return rows


# Characters a line of a Kaldi table may not hold: the C0 and C1 controls but tab, LF and CR.
_CONTROL = re.compile(r"[\x00-\x08\x0b-\x0c\x0e-\x1f\x7f-\x9f]")


def _decoded_line(path: Path, number: int, raw: bytes) -> str:
    """One line of a Kaldi table as text (a UTF-8 byte-order mark on line 1 dropped); KaldiDataDirError
    naming the file, line and byte or character when it is not UTF-8 or holds a control character."""
    try:
        line = raw.decode("utf-8-sig" if number == 1 else "utf-8")
    except UnicodeDecodeError as error:
        raise KaldiDataDirError(f"{path}:{number}: byte {error.start + 1} of the line is not UTF-8 "
                                f"({raw[error.start:error.start + 1]!r}); save the file as UTF-8") from None
    control = _CONTROL.search(line)
    if control:
        raise KaldiDataDirError(f"{path}:{number}: character {control.start() + 1} of the line is the control "
                                f"character {control.group()!r}; a Kaldi table holds printable text only")
    return line


def read_kaldi_data_dir(path: str | Path, require_utt2spk: bool = True, allow_commands: bool = False,
                        allow_option: str = "data.allow_commands=true") -> KaldiDataDir:
    """Reads a data directory. With require_utt2spk=False a missing utt2spk means every
    utterance is its own speaker (enough for scoring a model on a user's audio). A wav.scp pipe
    (`... |`) runs a shell command, so it is a KaldiDataDirError naming its line and `allow_option`
    unless `allow_commands` (asr.data.audio.command_sources)."""
    path = Path(path)
    required = ("wav.scp", "text", "utt2spk") if require_utt2spk else ("wav.scp", "text")
    needs = (f"a data directory is a folder holding {', '.join(required[:-1])} and {required[-1]}, as written by "
             "Kaldi's data preparation, e.g. egs/wsj/s5/local/wsj_data_prep.sh")
    if not path.exists():
        raise KaldiDataDirError(f"Kaldi data directory {path} not found")
    if not path.is_dir():
        raise KaldiDataDirError(f"{path} is a file, not a Kaldi data directory ({needs})")
    for name in required:
        if not (path / name).is_file():
            raise KaldiDataDirError(f"{path} is not a Kaldi data directory: {name} is missing ({needs})")
    recordings = {}
    for number, fields in read_kaldi_table(path / "wav.scp", key="recording id"):
        recordings[fields[0]] = parse_wav_scp_value(fields[1])
        if recordings[fields[0]].command is not None:
            try:
                refuse_command(path / "wav.scp", f"line {number} ({fields[0]})", recordings[fields[0]].command,
                               allow_commands, allow_option)
            except CommandNotAllowedError as error:
                raise KaldiDataDirError(str(error)) from None
    texts = {}
    for _, fields in read_kaldi_table(path / "text", min_fields=1):
        texts[fields[0]] = tuple(fields[1:])
    speakers = {} if (path / "utt2spk").is_file() else {utterance_id: utterance_id for utterance_id in texts}
    for number, fields in read_kaldi_table(path / "utt2spk") if (path / "utt2spk").is_file() else ():
        value = fields[1].split()
        if len(value) != 1:
            raise KaldiDataDirError(f"{path / 'utt2spk'}:{number}: expected '<utterance-id> <speaker-id>'")
        speakers[fields[0]] = value[0]
    segments: dict[str, tuple[str, float, float]] = {}
    if (path / "segments").is_file():
        for number, fields in read_kaldi_table(path / "segments", min_fields=4):
            try:
                segments[fields[0]] = (fields[1], float(fields[2]), float(fields[3]))
            except ValueError:
                raise KaldiDataDirError(f"{path / 'segments'}:{number}: start and end must be seconds") from None
            if not (math.isfinite(segments[fields[0]][1]) and math.isfinite(segments[fields[0]][2])):
                raise KaldiDataDirError(f"{path / 'segments'}:{number}: start and end must be finite seconds, "
                                        f"got {fields[2]} and {fields[3]}")

    problems = []
    utterances = []
    for utterance_id, words in texts.items():
        if utterance_id not in speakers:
            problems.append(("missing_speaker", utterance_id, f"{utterance_id} is in text but not in utt2spk"))
            continue
        if segments:
            if utterance_id not in segments:
                problems.append(("missing_audio", utterance_id, f"{utterance_id} is in text but not in segments"))
                continue
            recording_id, start, end = segments[utterance_id]
        else:
            recording_id, start, end = utterance_id, 0.0, None
        if recording_id not in recordings:
            problems.append(("missing_audio", utterance_id, f"{utterance_id}: recording {recording_id} is not in wav.scp"))
            continue
        utterances.append(KaldiUtterance(utterance_id, recording_id, words, speakers[utterance_id], start, end))
    transcribed = {u.recording_id for u in utterances} | {segments.get(u, (u,))[0] for u in texts}
    for recording_id in recordings:
        if recording_id not in transcribed:
            problems.append(("missing_transcript", recording_id, f"{recording_id} is in wav.scp but has no transcript in text"))
    return KaldiDataDir(path, recordings, utterances, problems)

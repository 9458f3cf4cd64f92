"""Where a recording's samples come from: a file (SPHERE, WAV, FLAC, ...) or a shell pipeline.

Kaldi's wav.scp entries are either a path or a command ending in `|` whose standard output is a
WAV file (`sph2pipe -f wav -p -c 1 /corpus/sw02001.sph |`). `AudioSource.load()` turns either into
int16 samples. A `sph2pipe` command is run as written when sph2pipe is installed; when it is not,
we read the SPHERE file it names ourselves (sphere.py), so Kaldi data directories prepared on
another machine work here without sph2pipe. A wav.scp pipe is read at all only with
data.allow_commands=true (asr.data.corpus.kaldi_dir refuses it otherwise); each command that runs is logged
the first time (asr.data.audio.command_sources).
"""

from __future__ import annotations

import io
import shlex
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import soundfile

from asr.data.audio.command_sources import announce_command
from asr.data.audio.sphere import SphereError, is_sphere, read_sphere


class AudioSourceError(Exception):
    """Audio that cannot be loaded; `kind` is the report's category for it."""

    kind = "unreadable_audio"


class AudioMissingError(AudioSourceError):
    kind = "missing_audio"


@dataclass(frozen=True)
class AudioSource:
    """A file path or a shell command (`command` without the trailing '|'); `channel` is 0-based."""

    path: str | None = None
    command: str | None = None
    channel: int | None = None

    def __post_init__(self):
        if (self.path is None) == (self.command is None):
            raise ValueError("an AudioSource is either a path or a command")

    def describe(self) -> str:
        where = self.path if self.path is not None else f"command `{self.command} |`"
        return where if self.channel is None else f"{where} (channel {self.channel})"

    def load(self) -> tuple[np.ndarray, int]:
        """-> (int16 samples (samples,) of the selected channel, sample_rate).

        A multi-channel source with no channel selected is an error: mixing conversation sides
        would make a wrong transcript, so the recipe must say which channel it wants.
        """
        if self.path is not None:
            samples, rate = read_audio_file(Path(self.path))
        else:
            samples, rate = run_audio_command(self.command)
        return select_channel(samples, self.channel, self.describe()), rate


def select_channel(samples: np.ndarray, channel: int | None, where: str) -> np.ndarray:
    if channel is None:
        if samples.shape[0] != 1:
            raise AudioSourceError(f"{where} has {samples.shape[0]} channels and nothing names the one to use (mixed, "
                                   "the speakers would blend): make it mono, e.g. `sox in.wav out.wav remix 1`, or "
                                   "name a channel in the recipe")
        return samples[0]
    if not 0 <= channel < samples.shape[0]:
        raise AudioSourceError(f"{where} has {samples.shape[0]} channel(s); channel index {channel} (counting from 0) does not exist")
    return samples[channel]


def check_regular_file(path: Path) -> None:
    """AudioMissingError when `path` does not exist; AudioSourceError when it is a folder, a FIFO, a
    device or a socket (reading a FIFO would wait for a writer forever)."""
    problem = not_a_regular_file(path)
    if problem == FILE_NOT_FOUND:
        raise AudioMissingError(f"{path}: {problem}")
    if problem:
        raise AudioSourceError(f"{path}: {problem}")


FILE_NOT_FOUND = "file not found"


def not_a_regular_file(path: str | Path) -> str | None:
    """Why `path` is not a regular file one can read audio from, or None when it is one."""
    path = Path(path)
    if path.is_file():
        return None
    if path.is_dir():
        return "a folder, not an audio file"
    if path.exists():
        return "not a regular file (a FIFO, device or socket), so not an audio file"
    return FILE_NOT_FOUND


def read_audio_file(path: Path) -> tuple[np.ndarray, int]:
    """Any SPHERE file, or anything libsndfile reads (WAV, FLAC, ...) -> (int16 (channels, n), rate)."""
    check_regular_file(path)
    try:
        if is_sphere(path):
            return read_sphere(path)
        samples, rate = soundfile.read(str(path), dtype="int16", always_2d=True)
    except SphereError as error:
        raise AudioSourceError(str(error)) from None
    except (RuntimeError, soundfile.LibsndfileError, OSError) as error:
        raise AudioSourceError(f"{path}: unreadable audio ({error})") from None
    return samples.T.copy(), rate


def run_audio_command(command: str) -> tuple[np.ndarray, int]:
    """Run a wav.scp pipeline and decode the WAV it writes -> (int16 (channels, n), rate)."""
    words = _split(command)
    program = words[0] if words else ""
    if program.endswith("sph2pipe") and shutil.which(program) is None:
        emulated = _read_like_sph2pipe(words)
        if emulated is not None:
            return emulated
    if words and shutil.which(program) is None and "|" not in words:
        raise AudioSourceError(
            f"wav.scp command `{command} |` needs `{program}`, which is not installed (not on PATH)"
        )
    announce_command(command)
    result = subprocess.run(command, shell=True, capture_output=True)
    if result.returncode != 0:
        message = result.stderr.decode(errors="replace").strip().splitlines()
        raise AudioSourceError(
            f"wav.scp command `{command} |` failed (exit {result.returncode}): {message[-1] if message else ''}"
        )
    try:
        samples, rate = soundfile.read(io.BytesIO(result.stdout), dtype="int16", always_2d=True)
    except (RuntimeError, soundfile.LibsndfileError) as error:
        raise AudioSourceError(f"wav.scp command `{command} |` did not write readable audio ({error})") from None
    return samples.T.copy(), rate


def _split(command: str) -> list[str]:
    try:
        return shlex.split(command)
    except ValueError:
        return command.split()


def _read_like_sph2pipe(words: list[str]) -> tuple[np.ndarray, int] | None:
    """Do what `sph2pipe [-f fmt] [-p] [-u] [-c N] FILE` does, without sph2pipe.

    Returns None for options we do not emulate (time ranges -t/-s, output codings other than PCM),
    so the caller runs the command and reports sph2pipe missing.
    """
    channel = None
    files = []
    arguments = iter(words[1:])
    for word in arguments:
        if word == "-f":
            next(arguments, None)  # output container: we return samples, not bytes
        elif word == "-p":
            pass  # PCM output: what we produce anyway
        elif word == "-c":
            value = next(arguments, "")
            if not value.isdigit():
                return None
            channel = int(value) - 1  # sph2pipe counts channels from 1
        elif word.startswith("-"):
            return None
        else:
            files.append(word)
    if len(files) != 1:
        return None
    samples, rate = read_audio_file(Path(files[0]))
    if channel is not None:
        samples = select_channel(samples, channel, f"{files[0]} (sph2pipe -c {channel + 1})")[None]
    return samples, rate

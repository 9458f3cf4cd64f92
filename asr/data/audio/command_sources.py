"""Audio that a shell command writes: a lhotse manifest's recording source of type "command", or a
Kaldi wav.scp line ending in `|` (`sph2pipe -f wav -p /corpus/a.wv1 |`).

Such a source runs whatever it names, with the user's rights, so a manifest or a data folder from
somewhere else could run anything. Nothing runs unless the user sets `data.allow_commands=true`
(asr.train, asr.evaluate): without it, the file's reader stops before any audio is read, naming the
file, the line or cut and the option (`refuse_command`). With it, each distinct command is logged
the first time this process runs it (`announce_command`), so the user sees what ran. The recipes
never write command sources (they convert every recording to a plain audio file); the one that
reads a Kaldi folder (recipes.wsj.prepare) runs its pipes only with its own `--allow-commands`.
"""
from __future__ import annotations

import logging

ALLOW_OPTION = "data.allow_commands"
COMMAND_SOURCE_TYPE = "command"       # lhotse's AudioSource.type of a recording read from a command
SHOWN_CHARACTERS = 200                # of a command in an error message

log = logging.getLogger(__name__)
_announced: set[str] = set()


class CommandNotAllowedError(ValueError):
    """A file names a shell command to run for its audio, and data.allow_commands is not set."""


def refuse_command(file, where: str, command: str, allowed: bool, option: str = f"{ALLOW_OPTION}=true") -> None:
    """CommandNotAllowedError naming `file`, `where` in it (a line, a cut) and the `option` that allows
    it (a recipe's is its own command-line flag), unless `allowed`."""
    if allowed:
        return
    shown = command if len(command) <= SHOWN_CHARACTERS else command[:SHOWN_CHARACTERS] + "..."
    raise CommandNotAllowedError(
        f"{file}: {where} gets its audio by running the shell command `{shown}`; commands in data files run "
        f"with your rights, so they run only with {option}: give it if you trust this file, or "
        "convert the audio to files")


def recording_commands(recording) -> list[str]:
    """The shell commands among a lhotse Recording's (or a manifest dict's) audio sources."""
    if recording is None:
        return []
    if isinstance(recording, dict):
        return [str(s.get("source")) for s in recording.get("sources") or [] if s.get("type") == COMMAND_SOURCE_TYPE]
    return [str(s.source) for s in recording.sources if s.type == COMMAND_SOURCE_TYPE]


def announce_command(command: str) -> None:
    """Log `command` the first time this process runs it (data.allow_commands=true let it run)."""
    if command in _announced:
        return
    _announced.add(command)
    log.warning("running the audio command `%s` (%s=true)", command, ALLOW_OPTION)


def announce_recording_commands(recording) -> None:
    for command in recording_commands(recording):
        announce_command(command)

"""Locks between processes on a file (flock) whose text names the holder, so that whoever finds the
lock taken can say by whom. The kernel releases an flock when its holder dies in any way, so a lock
file left by a killed process is simply taken over (its text is rewritten by the next holder).

This module imports nothing of asr: every layer may use it (asr.core.corpus_lock,
asr.model.run_folder).
"""
from __future__ import annotations

import fcntl
import os
import socket
from datetime import datetime
from typing import IO

NO_NAME_YET = "a process that has not written its name yet"


def try_lock(handle: IO[str]) -> str | None:
    """Takes the exclusive flock of the open lock file `handle` without waiting: None when this
    process now holds it, else the holder's line. The OSError of a file system without flock (e.g.
    Lustre mounted without it: ENOSYS) is left to the caller, which knows what to tell the user."""
    try:
        fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        handle.seek(0)
        return handle.read().strip() or NO_NAME_YET
    return None


def write_holder(handle: IO[str], what: str | None = None) -> None:
    """Writes into the held lock file who holds it: 'asr process PID on HOST[, WHAT], since TIME'."""
    handle.seek(0)
    handle.truncate()
    doing = f"{what}, " if what else ""
    handle.write(f"asr process {os.getpid()} on {socket.gethostname()}, {doing}since "
                 f"{datetime.now():%Y-%m-%d %H:%M:%S}\n")
    handle.flush()

"""Where a command writes its results: checked before the work starts (`unwritable_reason`), and a
write that failed on a full disk told as such (`disk_full`), since torch reports one as an
"unexpected pos" RuntimeError with the real cause only in its context.

This module imports nothing of asr but asr.core.errors: every layer may use it.
"""
from __future__ import annotations

import errno
import os
import tempfile
from pathlib import Path

from asr.core.errors import DiskFullError


def unwritable_reason(path: str | os.PathLike, folder: bool) -> str | None:
    """Why the folder (`folder`) or file `path` cannot be made and written, or None when it can: the
    nearest existing folder on its way must take a new file. Probed by creating and removing a file
    there, since a permission check says yes to root on a read-only file system."""
    path = Path(os.path.expanduser(os.fspath(path))).absolute()
    if path.exists():
        if folder and not path.is_dir():
            return f"{path} is a file, not a folder"
        if not folder and path.is_dir():
            return f"{path} is a folder, not a file"
    existing = path if folder and path.is_dir() else path.parent
    while not existing.exists():
        existing = existing.parent
    if not existing.is_dir():
        return f"{existing} is a file, not a folder"
    try:
        with tempfile.TemporaryFile(dir=existing, prefix=".write-check-"):
            pass
    except OSError as error:
        return f"{existing} cannot be written ({error.strerror or error})"
    return None


def full_disk_cause(error: BaseException) -> OSError | None:
    """The 'no space left on device' OSError that caused `error` (itself, its cause or context), or None."""
    seen = set()
    while error is not None and id(error) not in seen:
        seen.add(id(error))
        if isinstance(error, OSError) and error.errno in (errno.ENOSPC, errno.EDQUOT):
            return error
        error = error.__cause__ or error.__context__
    return None


def disk_full(error: BaseException, path: str | os.PathLike) -> DiskFullError | None:
    """A DiskFullError naming `path` when `error` came from a full disk (or quota), else None."""
    cause = full_disk_cause(error)
    if cause is None:
        return None
    what = "disk quota exceeded" if cause.errno == errno.EDQUOT else "no space left on device"
    full = DiskFullError(f"writing {path} failed: {what}; free some space there or write elsewhere")
    full.errno = cause.errno
    return full

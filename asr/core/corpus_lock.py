"""The lock that keeps the writes to a corpus folder to one process at a time, whichever runs they
belong to: generating the corpus (its recipe's preparer), and in its feature cache folder computing
features, statistics and streaming shards.

    with writing_corpus_folder(root, "generating corpus synth"):
        ...   # another process that asks for the same folder waits here, told who holds it

An flock on `<folder>/.corpus.lock`, whose text names the holder (pid, host, what it writes) for
whoever waits (and is empty when no one holds it). The kernel releases it when the holder dies in any way, so a lock file left by a
killed process is simply taken over. Readers take no lock: every file of a corpus folder is written
under a temporary name and renamed into place, so a reader sees it whole or not at all.

The processes of one run that an outside launcher starts together (torchrun, srun) meet here too,
so they still write one after another: the first does the work, the others find it on disk. It
holds between the processes of one machine on any file system; between machines only where the
file system makes flock locks cluster-wide (asr/docs/training.md, "Several GPUs and machines").
A process may take the lock of a folder it already holds (the outer hold keeps it).
"""
from __future__ import annotations

import fcntl
import logging
import os
from contextlib import contextmanager
from pathlib import Path

from asr.core.errors import ConfigError
from asr.core.file_locks import try_lock, write_holder

LOCK_FILE = ".corpus.lock"
log = logging.getLogger(__name__)
_held: set[Path] = set()   # resolved folders this process holds the lock of


@contextmanager
def writing_corpus_folder(folder: str | os.PathLike, what: str):
    """Holds the write lock of `folder` (made if missing) for the `with` block; waits, saying for whom,
    while another process holds it. `what`: what this process writes, for the waiting ones' message."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    key = folder.resolve()
    if key in _held:
        yield
        return
    with open(folder / LOCK_FILE, "a+") as handle:
        try:
            holder = try_lock(handle)
            if holder is not None:
                log.warning("%s is being written by another process (%s); waiting for it to finish", folder, holder)
                fcntl.flock(handle, fcntl.LOCK_EX)
        except OSError as error:   # e.g. Lustre mounted without flock: ENOSYS
            raise ConfigError(
                f"the corpus folder {folder} is on a file system without file locks (flock: {error.strerror}), "
                "which keep its writers to one at a time; give data.root (or data.cache_dir) on a file system "
                "with them (Lustre: mounted with -o flock)") from None
        write_holder(handle, what)
        _held.add(key)
        try:
            yield
        finally:
            _held.discard(key)
            handle.truncate(0)   # the name is of a holder: an unheld lock names none
            fcntl.flock(handle, fcntl.LOCK_UN)

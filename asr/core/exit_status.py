"""The exit statuses of every command of this project (the table in asr/README.md, "Exit statuses").

    0    success
    1    a failure while running (a traceback, or a message saying what failed)
    2    a usage or config error: a bad option, path, config value or checkpoint; the one-line
         message says what to change, and nothing was computed
    130  interrupted with Ctrl-C (128 + SIGINT, what shells report for it)

`run_command` gives a command these statuses (asr.config.command_line.run_key_value_command wraps it for
the key=value commands); asr.train (Hydra) maps them itself.
"""
from __future__ import annotations

import sys
from typing import Callable

from asr.core.errors import DiskFullError
from asr.core.output_paths import disk_full, full_disk_cause

SUCCESS = 0
FAILURE = 1
USAGE_ERROR = 2
INTERRUPTED = 130


def run_command(command: str, body: Callable[[], int | None], usage_errors: tuple[type[BaseException], ...] = (),
                failures: tuple[type[BaseException], ...] = (), resume_hint: str = "") -> int:
    """Runs a command's `body` and returns its exit status: the body's own (None: SUCCESS);
    USAGE_ERROR for `usage_errors` and FAILURE for `failures`, each printed as one
    '<command>: error: <message>' line on stderr without a traceback; INTERRUPTED after Ctrl-C,
    with `resume_hint` (how to continue) on the line that says so; FAILURE with one line for a write
    that found its disk full (asr.core.output_paths). Any other exception propagates: Python prints its traceback and exits with 1."""
    try:
        status = body()
    except usage_errors as error:
        print(f"{command}: error: {error}", file=sys.stderr)
        return USAGE_ERROR
    except failures as error:
        print(f"{command}: error: {error}", file=sys.stderr)
        return FAILURE
    except KeyboardInterrupt:
        print(f"\n{command}: interrupted{'; ' + resume_hint if resume_hint else ''}", file=sys.stderr)
        return INTERRUPTED
    except Exception as error:   # a full disk, wherever it struck: one line, not torch's "unexpected pos"
        cause = full_disk_cause(error)
        if cause is None:
            raise
        full = error if isinstance(error, DiskFullError) else disk_full(error, cause.filename or "a result")
        print(f"{command}: error: {full}", file=sys.stderr)
        return FAILURE
    return SUCCESS if status is None else status


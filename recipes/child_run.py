"""Running one `python -m asr.train` (or any command) to its end from a driver script: the experiment,
the ablation and the adaptation sweep each train their runs this way."""
from __future__ import annotations

import subprocess


def run_to_end(command: list[str]) -> int:
    """Runs `command` and returns its exit status. On Ctrl-C the same signal reaches the child, so it
    waits for the child's own clean shutdown (asr.train saves what it should) before re-raising."""
    process = subprocess.Popen(command)
    try:
        return process.wait()
    except KeyboardInterrupt:
        process.wait()
        raise

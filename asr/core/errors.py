"""Errors a user can cause, shared by every layer, and the "did you mean" helper of their messages.

This package imports nothing of asr: every layer may raise these and every command maps them to
its exit status (asr.core.exit_status).
"""
from __future__ import annotations

import difflib
from typing import Iterable

# How alike (difflib's ratio) a name must be to be offered: "max_minuts" -> "max_minutes" is 0.97,
# while "model.nonsense" is 0.63 from its nearest key, model.loss_weights (no suggestion).
SIMILARITY = 0.8


class ConfigError(ValueError):
    """A config value that is out of range or does not fit with another one."""


class EvaluationError(ValueError):
    """An argument, checkpoint or data source that cannot be evaluated; the message says what to do."""


def closest_name(word: str, names: Iterable[str]) -> str | None:
    """The name most like `word` (at least SIMILARITY alike), or None."""
    matches = difflib.get_close_matches(word, list(names), n=1, cutoff=SIMILARITY)
    return matches[0] if matches else None


class DiskFullError(OSError):
    """A write that failed because its file system is full; the message names the file or folder."""

"""Corpus preparers: the one way asr reaches a recipe, so that asr never imports recipes.

`python -m asr.train` (and `python -m asr.evaluate`) generates a corpus whose manifests are missing
only if a package registers a preparer for that corpus name as a Python entry point in the group
`asr.corpus_preparers`. This project registers two (pyproject.toml): the built-in synthetic corpus,
and the real-speech evaluation set made from Debian's Asterisk prompts (dev and test only):

    [project.entry-points."asr.corpus_preparers"]
    synth = "recipes.synth.prepare:prepare_synth"
    asterisk = "recipes.asterisk.prepare:prepare_asterisk"

A preparer is called as `preparer(root, progress=True, **options)` (options: the config's
`synth_corpus` section for synth when asr.train calls it; none from asr.evaluate) and writes
`{root}/{corpus}_cuts_{split}.jsonl.gz`; what it returns is logged. Entry points are read from the installed project's metadata, so a new one takes
effect after `pip install --no-build-isolation -e .` (`.ci/install.sh` runs it).
"""
from __future__ import annotations

from importlib.metadata import entry_points
from typing import Callable

GROUP = "asr.corpus_preparers"


def corpus_preparer(corpus: str) -> Callable | None:
    """The preparer registered for `corpus`, or None (a corpus the user prepares with its recipe)."""
    found = entry_points(group=GROUP, name=corpus)
    return next(iter(found)).load() if found else None


def registered_corpora() -> list[str]:
    return sorted({entry.name for entry in entry_points(group=GROUP)})


def unregistered_note() -> str:
    """For an error about missing manifests: which corpora asr.train would have generated itself."""
    corpora = registered_corpora()
    if corpora:
        return f"asr.train generates only {', '.join(corpora)} itself"
    return (f"no installed package registers a corpus preparer (entry-point group {GROUP}), so asr.train "
            "generates no corpus itself; an install older than that group lacks the built-in synth one: "
            "reinstall with `pip install --no-build-isolation -e .` (see .ci/install.sh)")

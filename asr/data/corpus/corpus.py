"""A corpus on disk, resolved once from the config (data.corpus, data.root, data.real_speech_test)
and handed down as one object, so no layer re-derives a folder from a string.

    corpus = Corpus.of(cfg.data)
    corpus.cuts_path("train")            # {root}/{name}_cuts_train.jsonl.gz (asr.data.corpus.manifests)
    corpus.real_speech_test              # the real-speech corpus scored after training, or None

Where a real-speech test set lives: in a folder of its own name beside the training corpus's
folder (`data.root=data/synth`, `data.real_speech_test=asterisk` -> `data/asterisk`), prepared
there by its recipe on first use (recipes/asterisk). One convention, written here only.
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

from asr.data.corpus.manifests import cuts_path


@dataclass(frozen=True)
class Corpus:
    name: str                                    # data.corpus: the manifests' name prefix
    root: Path                                   # data.root: `~` expanded; relative to the working folder
    real_speech_test: Optional["Corpus"] = None  # data.real_speech_test, in its folder beside `root`

    @classmethod
    def at(cls, name: str, root: str | os.PathLike, real_speech_test: str | None = None) -> "Corpus":
        root = Path(os.fspath(root)).expanduser()
        real = cls(real_speech_test, root.parent / real_speech_test) if real_speech_test else None
        return cls(name, root, real)

    @classmethod
    def of(cls, data: Any) -> "Corpus":
        """The corpus a data config (DataConfig or its DictConfig) names."""
        return cls.at(data.corpus, data.root, getattr(data, "real_speech_test", None))

    def cuts_path(self, split: str) -> Path:
        return cuts_path(self.root, self.name, split)

    def missing_splits(self, *splits: str) -> list[str]:
        """The splits (each once, in order) whose cuts manifest is not on disk."""
        return [split for split in dict.fromkeys(splits) if not self.cuts_path(split).is_file()]

"""Pronunciation lexicons in CMUdict format, and the phone targets they give a transcript.

Accepted line forms (CMUdict 0.7a, cmudict.dict, librispeech-lexicon.txt):

    WORD  HH AH0 L OW1          ;;; comment lines are skipped
    WORD(2)  ...                alternative pronunciations: the first one listed is used
    word hh ah0 l ow1 # note    lowercase words/phones and trailing '#' comments

Stress digits are removed, and every phone must then be one of CMUdict's 39 (ARPABET_39); a file
with any other phone is rejected with its line number, because PER targets from a foreign phone
set would be silently wrong. Several files can be loaded together; a later file overrides an
earlier one word by word, which is how a user supplies pronunciations for out-of-lexicon words
(`--extra-lexicon my_words.txt`) without editing CMUdict.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Iterable

from asr.text.phones import ARPABET_39, strip_stress
from asr.text.normalisation import normalise_token

_ALTERNATIVE = re.compile(r"\(\d+\)$")


class LexiconError(ValueError):
    """A lexicon file that is missing or not in CMUdict format."""


class Lexicon:
    def __init__(self, pronunciations: dict[str, tuple[str, ...]], sources: tuple[str, ...] = ()):
        self.pronunciations = pronunciations  # UPPERCASE word -> stress-free phones
        self.sources = sources

    def __len__(self) -> int:
        return len(self.pronunciations)

    def __contains__(self, word: str) -> bool:
        return word.upper() in self.pronunciations

    @classmethod
    def load(cls, paths: str | Path | Iterable[str | Path]) -> "Lexicon":
        if isinstance(paths, (str, Path)):
            paths = [paths]
        pronunciations: dict[str, tuple[str, ...]] = {}
        sources = []
        for path in paths:
            pronunciations.update(read_cmudict(Path(path)))
            sources.append(str(path))
        return cls(pronunciations, tuple(sources))

    def pronounce(self, tokens: Iterable[str]) -> tuple[list[str], list[str]]:
        """Phones for a transcript's tokens -> (phones, out-of-lexicon tokens).

        A token is looked up as written ("U.S.", ",COMMA", "ONE-TIME"); failing that, each word of
        its normalised form is ("one", "time"). The second step is what lets hyphenated words and
        verbalised punctuation share the entries of their parts.
        """
        phones: list[str] = []
        missing: list[str] = []
        for token in tokens:
            whole = self.pronunciations.get(token.upper())
            if whole is not None:
                phones.extend(whole)
                continue
            words = normalise_token(token)
            parts = [self.pronunciations.get(word.upper()) for word in words]
            if any(part is None for part in parts):
                missing.append(token.upper())
                continue
            for part in parts:
                phones.extend(part)
        return phones, missing


def read_cmudict(path: Path) -> dict[str, tuple[str, ...]]:
    if not path.is_file():
        raise LexiconError(
            f"lexicon {path} not found: give a CMUdict-format file (e.g. cmudict-0.7b or cmudict.dict from "
            "https://github.com/cmusphinx/cmudict, or LibriSpeech's librispeech-lexicon.txt)"
        )
    allowed = set(ARPABET_39)
    entries: dict[str, tuple[str, ...]] = {}
    with open(path, encoding="latin-1") as handle:
        for number, line in enumerate(handle, start=1):
            line = line.split(" #", 1)[0].strip()
            if not line or line.startswith(";;;"):
                continue
            fields = line.split()
            if len(fields) < 2:
                raise LexiconError(f"{path}:{number}: expected 'WORD PHONE PHONE ...', got {line!r}")
            word = _ALTERNATIVE.sub("", fields[0]).upper()
            phones = tuple(strip_stress(phone.upper()) for phone in fields[1:])
            unknown = [phone for phone in phones if phone not in allowed]
            if unknown:
                raise LexiconError(
                    f"{path}:{number}: phone(s) {unknown} of {fields[0]!r} are not CMUdict's 39 phones "
                    f"({' '.join(ARPABET_39)}); a lexicon in another phone set cannot give PER targets"
                )
            entries.setdefault(word, phones)  # the first pronunciation of a word wins
    if not entries:
        raise LexiconError(f"lexicon {path} holds no entries")
    return entries

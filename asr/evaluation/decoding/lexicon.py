"""Pronunciation lexicons for decoding: word -> one or more phone spellings.

Line forms accepted (our `lexicon.txt`, CMUdict, LibriSpeech's librispeech-lexicon.txt):

    word  HH AH L OW            one pronunciation per line; a word may have several lines
    WORD(2)  HH AH0 L OW1       CMUdict: (N) alternative markers and stress digits are removed
    ;;; comment                 skipped, as are empty lines and trailing '#' comments

Words are lowercased (transcripts are lowercase). Unlike `recipes.lexicon` (which picks one
pronunciation per word to make phone targets), every pronunciation is kept: the decoder searches
all of them.
"""
from __future__ import annotations

import re
from pathlib import Path
from typing import Iterable

from asr.text.phones import strip_stress

_ALTERNATIVE = re.compile(r"\(\d+\)$")
# The longest pronunciation a lexicon line may hold. English words stay under 50 phones; the decoder's
# trie is walked recursively, and a spelling of 100,000 phones overflowed the native stack (SIGSEGV).
MAX_PRONUNCIATION_PHONES = 1000


class LexiconFileError(ValueError):
    """A lexicon that is missing, malformed, or does not fit the model or LM; the message says what to do."""


def first_examples(items: Iterable[str], limit: int = 5) -> str:
    """The first `limit` items, quoted, for a message that names them: 'a', 'b', 'c' and 7 more."""
    items = list(items)
    shown = ", ".join(repr(item) for item in items[:limit])
    return shown + (f" and {len(items) - limit} more" if len(items) > limit else "")


def read_lexicon(path: str | Path) -> dict[str, list[tuple[str, ...]]]:
    """word -> its distinct pronunciations (stress-free phones), in file order."""
    path = Path(path)
    if not path.is_file():
        raise LexiconFileError(f"lexicon file {path} does not exist; give lexicon=PATH (lines 'word PH ON ES')")
    lexicon: dict[str, list[tuple[str, ...]]] = {}
    malformed: list[str] = []
    too_long: list[str] = []
    try:
        lines = path.read_text(encoding="utf-8", errors="strict").splitlines()
    except (OSError, UnicodeDecodeError) as error:
        raise LexiconFileError(f"lexicon file {path} cannot be read as UTF-8 text ({error})") from None
    for number, line in enumerate(lines, 1):
        line = line.split("#", 1)[0].strip() if not line.startswith(";;;") else ""
        if not line:
            continue
        fields = line.split()
        if len(fields) < 2:
            malformed.append(f"line {number}: {line[:40]!r}")
            continue
        if len(fields) - 1 > MAX_PRONUNCIATION_PHONES:
            too_long.append(f"line {number}: {fields[0][:40]!r} with {len(fields) - 1} phones")
            continue
        word = _ALTERNATIVE.sub("", fields[0]).lower()
        phones = tuple(strip_stress(phone).upper() for phone in fields[1:])
        spellings = lexicon.setdefault(word, [])
        if phones not in spellings:
            spellings.append(phones)
    if malformed:
        raise LexiconFileError(f"lexicon file {path}: {len(malformed)} lines are not 'word PHONE PHONE ...' "
                               f"({first_examples(malformed)})")
    if too_long:
        raise LexiconFileError(f"lexicon file {path}: {len(too_long)} pronunciations are longer than "
                               f"{MAX_PRONUNCIATION_PHONES} phones ({'; '.join(too_long[:3])}); a line spells one word")
    if not lexicon:
        raise LexiconFileError(f"lexicon file {path} holds no pronunciations")
    return lexicon


def check_lexicon_phones(lexicon: dict[str, list[tuple[str, ...]]], phones: Iterable[str], path: str | Path) -> None:
    """LexiconFileError when the lexicon spells words with phones outside the model's phone set."""
    known = set(phones)
    unknown: dict[str, list[str]] = {}
    for word, spellings in lexicon.items():
        for spelling in spellings:
            for phone in spelling:
                if phone not in known:
                    unknown.setdefault(phone, []).append(word)
    if unknown:
        words = sorted({word for ws in unknown.values() for word in ws})
        raise LexiconFileError(
            f"lexicon file {path}: {len(words)} words are spelled with {len(unknown)} phones the model does "
            f"not have ({first_examples(sorted(unknown))}; e.g. in {first_examples(words)}); the model's phones are "
            f"{' '.join(sorted(known))}: map the lexicon onto them")


def write_lexicon(lexicon: dict[str, list[tuple[str, ...]]], path: str | Path) -> Path:
    """Writes `word PH ON ES` lines (one per pronunciation, words sorted), atomically."""
    import os
    path = Path(path)
    partial = path.with_name(path.name + ".partial")
    partial.write_text("".join(f"{word} {' '.join(spelling)}\n" for word in sorted(lexicon)
                               for spelling in lexicon[word]), encoding="utf-8")
    os.replace(partial, path)
    return path


def words_to_phones(text: str, lexicon: dict[str, list[tuple[str, ...]]]) -> tuple[str, list[str]]:
    """A word transcript's phone reference (each word's first pronunciation) and its words
    missing from the lexicon (the reference then lacks them)."""
    phones: list[str] = []
    missing: list[str] = []
    for word in text.split():
        spellings = lexicon.get(word.lower())
        if spellings:
            phones.extend(spellings[0])
        else:
            missing.append(word)
    return " ".join(phones), missing

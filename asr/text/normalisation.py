"""The word form every manifest stores in `supervision.text`: lowercase a-z and apostrophes,
words separated by single spaces.

Corpus recipes first remove their own markup (noise tags, fragments, verbalised-punctuation
spelling); what reaches `normalise_token` is a written word such as "ONE-TIME", "U.S.", ",COMMA"
or "don't". Any character other than a-z and the apostrophe splits the word, so hyphenated words
become two words ("one time") and abbreviations become letters ("u s"); pronunciation lookup
(lexicon.py) uses the same split, so text and phones always describe the same words.
`read_normalised_lines` reads a user's own text (asr.lexicon, asr.build_lm) the same way.
"""

from __future__ import annotations

import gzip
import re
import sys
import zlib
from pathlib import Path

_NOT_WORD_CHARACTER = re.compile(r"[^a-z']+")


def normalise_token(token: str) -> list[str]:
    """'ONE-TIME' -> ['one', 'time']; ',COMMA' -> ['comma']; "'EM" -> ["'em"]; '--' -> []."""
    words = _NOT_WORD_CHARACTER.split(token.lower())
    # A word made of apostrophes only (a quote mark) is no word.
    return [word for word in words if word.strip("'")]


def normalise_transcript(tokens: list[str]) -> str:
    return " ".join(word for token in tokens for word in normalise_token(token))


class TextFileError(ValueError):
    """A text file that is missing or cannot be read as UTF-8 text; the message names it."""


def read_normalised_lines(path: str | Path) -> list[str]:
    """The lines of a UTF-8 text file (plain, or gzipped when it ends in .gz), each normalised as
    transcripts are (normalise_transcript of its white-space-separated tokens), lines left
    without words dropped: 'The U.S. one-time fee, 2024!' -> 'the u s one time fee'. One line is
    one sentence for an LM, so running text is best given one sentence per line. '-' reads stdin."""
    if str(path) == "-":
        return [line for line in (normalise_transcript(raw.split()) for raw in sys.stdin) if line]
    path = Path(path)
    if path.is_dir():
        raise TextFileError(f"{path} is a folder; give text files (one sentence or word per line)")
    if not path.is_file():
        raise TextFileError(f"text file {path} does not exist")
    try:
        opened = gzip.open(path, "rt", encoding="utf-8") if path.suffix == ".gz" else open(path, encoding="utf-8")
        with opened as handle:
            lines = [normalise_transcript(line.split()) for line in handle]
    except (OSError, EOFError, UnicodeDecodeError, zlib.error) as error:   # zlib: a damaged .gz past its header
        raise TextFileError(f"text file {path} cannot be read as UTF-8 text ({error})") from None
    return [line for line in lines if line]

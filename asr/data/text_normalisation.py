"""The word form every manifest stores in `supervision.text`: lowercase a-z and apostrophes,
words separated by single spaces.

Corpus recipes first remove their own markup (noise tags, fragments, verbalised-punctuation
spelling); what reaches `normalise_token` is a written word such as "ONE-TIME", "U.S.", ",COMMA"
or "don't". Any character other than a-z and the apostrophe splits the word, so hyphenated words
become two words ("one time") and abbreviations become letters ("u s"); pronunciation lookup
(lexicon.py) uses the same split, so text and phones always describe the same words.
"""

from __future__ import annotations

import re

_NOT_WORD_CHARACTER = re.compile(r"[^a-z']+")


def normalise_token(token: str) -> list[str]:
    """'ONE-TIME' -> ['one', 'time']; ',COMMA' -> ['comma']; "'EM" -> ["'em"]; '--' -> []."""
    words = _NOT_WORD_CHARACTER.split(token.lower())
    # A word made of apostrophes only (a quote mark) is no word.
    return [word for word in words if word.strip("'")]


def normalise_transcript(tokens: list[str]) -> str:
    return " ".join(word for token in tokens for word in normalise_token(token))

"""The text of the synthetic corpus: English usage examples from WordNet 3.0.

WordNet glosses carry quoted usage examples ("the children went to the playground"). We keep the
ones a synthesiser reads exactly as written, so that the spoken words are the transcript:
letters, internal apostrophes and hyphens, and clause punctuation only (no digits, which would be
read out as number words; no all-capital or camel-case tokens, which are spelled out as letters or
are unusual names; no quotes, ellipses, brackets or dashes), and 4-14 words each. Duplicates (case-
insensitive) are removed and the list is sorted, so the file does not depend on the order of the
WordNet data files.

The filtered list ships as ``sentences.txt.gz`` beside this module (with ``LICENSE.wordnet``), so
generating the corpus does not need the ``wordnet-base`` package. This module rebuilds it:

    apt-get install -y wordnet-base
    python -m recipes.synth.sentences --wordnet /usr/share/wordnet --out recipes/synth/sentences.txt.gz
"""

from __future__ import annotations

import argparse
import gzip
import re
from pathlib import Path

SENTENCES_FILE = Path(__file__).with_name("sentences.txt.gz")
WORDNET_DATA_FILES = ("data.noun", "data.verb", "data.adj", "data.adv")
MIN_WORDS, MAX_WORDS = 4, 14

# A sentence is letters, spaces, internal ' and -, clause punctuation, and an optional final . ! ?
_ALLOWED_SENTENCE = re.compile(r"^[A-Za-z][A-Za-z' ,;:\-]*[A-Za-z][.!?]?$")
_QUOTED = re.compile(r'"([^"]*)"')
_WORD_SPLIT = re.compile(r"[\s\-]+")
_PUNCTUATION = re.compile(r"[,;:.!?]")


def normalise_text(sentence: str) -> str:
    """The transcript form: lowercase words (a-z and apostrophes) separated by single spaces.

    Hyphens separate words ("well-known" is spoken "well known"); clause punctuation is removed.
    """
    words = _WORD_SPLIT.split(_PUNCTUATION.sub(" ", sentence).strip())
    return " ".join(word.lower() for word in words if word)


def is_speakable(sentence: str) -> bool:
    """True if a synthesiser reads ``sentence`` as exactly the words of ``normalise_text``."""
    if not _ALLOWED_SENTENCE.match(sentence):
        return False
    if re.search(r"\s-|-\s|--|''", sentence):  # dashes used as punctuation
        return False
    words = _WORD_SPLIT.split(_PUNCTUATION.sub(" ", sentence).strip())
    if not MIN_WORDS <= len(words) <= MAX_WORDS:
        return False
    if any(sum(c.isupper() for c in word) >= 2 for word in words):  # acronyms: spelled out
        return False
    if any(word.startswith("'") or word.endswith("'") for word in words):  # quote marks
        return False
    return True


def extract_wordnet_examples(wordnet_dir: str | Path) -> list[str]:
    """All quoted usage examples in the glosses of the WordNet 3.0 data files, in file order."""
    wordnet_dir = Path(wordnet_dir)
    examples = []
    for name in WORDNET_DATA_FILES:
        path = wordnet_dir / name
        if not path.is_file():
            raise FileNotFoundError(
                f"WordNet data file {path} not found: install the Debian package wordnet-base "
                f"(apt-get install -y wordnet-base) or pass --wordnet DIR holding {', '.join(WORDNET_DATA_FILES)}"
            )
        with open(path, encoding="latin-1") as lines:
            for line in lines:
                if line.startswith("  ") or " | " not in line:  # licence header / no gloss
                    continue
                gloss = line.split(" | ", 1)[1]
                examples.extend(example.strip() for example in _QUOTED.findall(gloss))
    return examples


def build_sentence_list(wordnet_dir: str | Path) -> list[str]:
    """The filtered, de-duplicated, sorted sentence list, each ending in . ! or ?"""
    unique = {}
    for example in extract_wordnet_examples(wordnet_dir):
        if is_speakable(example):
            sentence = example if example[-1] in ".!?" else example + "."
            unique.setdefault(normalise_text(sentence), sentence)
    return sorted(unique.values(), key=lambda s: (normalise_text(s), s))


def write_sentence_list(sentences: list[str], path: str | Path) -> None:
    # mtime=0: the same list gives byte-identical files.
    with open(path, "wb") as raw, gzip.GzipFile(fileobj=raw, mode="wb", mtime=0, filename="") as gz:
        gz.write("".join(s + "\n" for s in sentences).encode("utf-8"))


def load_sentences(path: str | Path = SENTENCES_FILE) -> list[str]:
    """The shipped sentence list (one sentence a line)."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(
            f"sentence list {path} is missing; rebuild it with "
            f"`python -m recipes.synth.sentences --out {path}` (needs Debian package wordnet-base)"
        )
    with gzip.open(path, "rt", encoding="utf-8") as lines:
        return [line.rstrip("\n") for line in lines if line.strip()]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--wordnet", default="/usr/share/wordnet", help="folder with WordNet 3.0 data.* files")
    parser.add_argument("--out", default=str(SENTENCES_FILE), help="output .txt.gz")
    args = parser.parse_args(argv)
    sentences = build_sentence_list(args.wordnet)
    write_sentence_list(sentences, args.out)
    print(f"wrote {len(sentences)} sentences to {args.out}")


if __name__ == "__main__":
    main()

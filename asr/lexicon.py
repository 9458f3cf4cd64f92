"""Pronounce new words for lexicon decoding: `python -m asr.lexicon WORDS_OR_TEXT... --out lexicon.txt`.

    python -m asr.lexicon my_words.txt --out lexicon.txt
    python -m asr.lexicon domain_text.txt --base runs/<preset>/<time>/decoding/lexicon.txt --out lexicon.txt
    python -m asr.lexicon a.txt b.txt.gz --base cmudict.dict --out lexicon.txt --weak-forms 0

Reads word lists or running text (UTF-8, plain or .gz, `-` for stdin; any mix), normalised as training
transcripts are (asr.text.normalisation: lowercase a-z and apostrophes, so "One-time" is the
two words "one time", digits and punctuation go), and writes a lexicon (`word PH ON ES` lines) with
every word of `--base` (if given: our lexicon.txt or CMUdict format; its pronunciations kept, written
in our form: lowercase words, no stress digits) and every word of the text the base lacks, pronounced with the tools and the phone set of the built-in
corpus's training (asr.evaluation.decoding.pronunciation): each word said alone by espeak-ng en-us and
en-us-nyc and by flite, mapped to ARPABET_39, every distinct pronunciation kept. As in the synth
recipe's lexicon, the `--weak-forms` (100) most frequent one-vowel new words of the text get
their weak form too ("a" EY -> AH, "for" F AO R -> F ER); only words the text holds at least twice
count, so a word list (each word once) gets none. Words of the base are never pronounced again.

Prints one summary line (words written, how many from the base, how many new, the output), and
names the words no synthesiser pronounces in ARPAbet (left out). The output is written under a
temporary name and renamed, so it is whole or absent; `--out` may be the `--base` file itself.
A progress bar follows the pronouncing (200 words per synthesiser run).

Exit status: 0 written (also when some words could not be pronounced: they are listed); 2 a usage
error (no text, an unreadable file, a word over 100 letters, a bad base lexicon); 1 when espeak-ng
or flite is missing or fails (the message names the Debian package).
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

from asr.core.exit_status import USAGE_ERROR, run_command
from asr.evaluation.decoding.lexicon import LexiconFileError
from asr.evaluation.decoding.lexicon_builder import build_lexicon
from asr.evaluation.decoding.pronunciation import WEAK_FORM_WORDS, PronunciationError
from asr.text.normalisation import TextFileError

COMMAND = "asr.lexicon"


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog=f"python -m {COMMAND}", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("texts", nargs="+", metavar="WORDS_OR_TEXT",
                        help="word lists or running text, UTF-8 (.gz too; - reads stdin)")
    parser.add_argument("--out", required=True, type=Path, help="the lexicon to write (word PH ON ES lines)")
    parser.add_argument("--base", type=Path, default=None,
                        help="a lexicon whose words are kept as they are (e.g. the model's decoding/lexicon.txt)")
    parser.add_argument("--weak-forms", type=int, default=WEAK_FORM_WORDS, metavar="N",
                        help=f"weak forms for the N most frequent one-vowel new words (default {WEAK_FORM_WORDS})")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(sys.argv[1:] if argv is None else argv)   # bad options: argparse, exit 2
    if args.weak_forms < 0:
        print(f"{COMMAND}: error: --weak-forms {args.weak_forms} must be 0 or more", file=sys.stderr)
        return USAGE_ERROR

    def build_and_report() -> None:
        summary = build_lexicon([Path(p) for p in args.texts], args.out, args.base, args.weak_forms,
                                progress=not args.no_progress)
        base = f", {summary['base_words']} from {args.base}" if args.base is not None else ""
        print(f"{summary['out']}: {summary['words']} words{base}, {summary['new_words']} new of the text's "
              f"{summary['text_words']} distinct words ({summary['new_pronunciations']} pronunciations from "
              f"espeak-ng and flite, weak forms included)")
        if summary["unpronounceable"]:
            print(f"{COMMAND}: {len(summary['unpronounceable'])} words no synthesiser pronounces in ARPAbet "
                  f"were left out: {' '.join(summary['unpronounceable'])}", file=sys.stderr)

    return run_command(COMMAND, build_and_report, usage_errors=(TextFileError, LexiconFileError),
                       failures=(PronunciationError,))


if __name__ == "__main__":
    sys.exit(main())

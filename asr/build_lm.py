"""Build a word n-gram LM from your own text: `python -m asr.build_lm TEXT... --lexicon L --out lm.arpa.gz`.

    python -m asr.build_lm domain_text.txt --lexicon lexicon.txt --order 3 --out lm.arpa.gz
    python -m asr.build_lm a.txt b.txt.gz --lexicon lexicon.txt --order 4 --out lm/4gram.arpa

Reads UTF-8 text (plain or .gz; `-` is stdin), one sentence per line, normalised as training transcripts are
(asr.text.normalisation: lowercase a-z and apostrophes), and estimates an interpolated
modified Kneser-Ney LM of `--order` (1-4; the decoder needs 2 or more) with the project's
estimator (asr.evaluation.decoding.ngram.estimate_arpa), written as ARPA (gzipped when --out ends in .gz),
under a temporary name and renamed, so it is whole or absent.

Vocabulary: the words of the text plus every word of `--lexicon`, plus </s> and <unk>; a lexicon
word the text never has gets the interpolated unigram share of an unseen word (what <unk> gets too),
so every word the decoder can spell has a probability. Text words outside the lexicon stay in the
LM (as the context of their neighbours; the decoder can never output them) and are reported: how
many distinct, their share of the text's words, the most frequent ones. Without --lexicon the
vocabulary is the text's words.

Prints the sentences and words read, the vocabulary, the n-gram counts per order, and the words
outside the lexicon. Exit status: 0 written; 2 a usage error (no text, an unreadable file, a bad
order or lexicon); 1 when the output cannot be written.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

from asr.core.exit_status import run_command
from asr.evaluation.decoding.lexicon import LexiconFileError
from asr.evaluation.decoding.ngram import MAX_ORDER, LanguageModelError, build_lm
from asr.text.normalisation import TextFileError

COMMAND = "asr.build_lm"


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog=f"python -m {COMMAND}", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("texts", nargs="+", metavar="TEXT",
                        help="text files, one sentence per line, UTF-8 (.gz too; - reads stdin)")
    parser.add_argument("--out", required=True, type=Path, help="the ARPA file to write (.arpa or .arpa.gz)")
    parser.add_argument("--lexicon", type=Path, default=None,
                        help="the decoding lexicon: its words join the LM's vocabulary (recommended)")
    parser.add_argument("--order", type=int, default=3, help=f"n-gram order, 2 to {MAX_ORDER} (default 3)")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(sys.argv[1:] if argv is None else argv)   # bad options: argparse, exit 2

    def build_and_report() -> None:
        summary = build_lm([Path(p) for p in args.texts], args.out, args.lexicon, args.order,
                           progress=not args.no_progress,
                           announce=lambda message: print(f"{COMMAND}: {message}", file=sys.stderr))
        counts = ", ".join(f"{n}-grams {count}" for n, count in enumerate(summary["ngrams"], 1))
        print(f"{summary['out']}: {args.order}-gram LM from {summary['sentences']} sentences, {summary['words']} "
              f"words; vocabulary {summary['vocabulary']} (with <s> </s> <unk>); {counts}")
        if summary["lexicon"]:
            outside = (f"{summary['outside_lexicon']} distinct words of the text ({100 * summary['outside_lexicon_share']:.2f}% "
                       f"of its words) are not in the lexicon and can never be decoded: "
                       f"{' '.join(summary['outside_lexicon_words'])}"
                       f"{' ...' if summary['outside_lexicon'] > len(summary['outside_lexicon_words']) else ''}"
                       if summary["outside_lexicon"]
                       else "every word of the text is in the lexicon")
            print(f"lexicon {summary['lexicon']}: {summary['lexicon_words']} words, {summary['lexicon_words_not_in_text']} "
                  f"of them not in the text (unigram share only); {outside}")

    return run_command(COMMAND, build_and_report, usage_errors=(TextFileError, LexiconFileError, LanguageModelError),
                       failures=(OSError,))


if __name__ == "__main__":
    sys.exit(main())

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
from collections import Counter
from pathlib import Path

from asr.text.phones import ARPABET_39
from asr.text.normalisation import TextFileError, read_normalised_lines
from asr.evaluation.decoding.lexicon import LexiconFileError, _examples, read_lexicon, write_lexicon
from asr.evaluation.decoding.pronunciation import (WEAK_FORM_WORDS, PronunciationError, add_weak_forms,
                                        check_pronouncing_programs, synthesiser_pronunciations)
from asr.core.exit_status import USAGE_ERROR, run_command

COMMAND = "asr.lexicon"
CHUNK_WORDS = 200            # words per call of the synthesisers (one progress step)
WEAK_FORM_MIN_COUNT = 2      # a word must occur this often in the text to get a weak form
# The longest word pronounced (English's longest dictionary words have 30-45 letters): a chunk of
# such words stays far below the 128 KiB the kernel allows one argument of the synthesisers.
MAX_WORD_LETTERS = 100


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


def text_words(paths: list[Path]) -> Counter:
    """word -> how often the texts hold it (normalised as transcripts), in first-seen order."""
    counts: Counter = Counter()
    for path in paths:
        for line in read_normalised_lines(path):
            words = line.split()
            longest = max(words, key=len)
            if len(longest) > MAX_WORD_LETTERS:
                raise TextFileError(f"{path}: a word of {len(longest)} letters ({longest[:20]}...); a word to "
                                    f"pronounce has at most {MAX_WORD_LETTERS} (is it text with its spaces lost?)")
            counts.update(words)
    if not counts:
        raise TextFileError(f"no words in {', '.join(str(p) for p in paths)} (after normalisation to "
                            "lowercase a-z and apostrophes): nothing to pronounce")
    return counts


def pronounce(words: list[str], progress: bool) -> tuple[dict[str, list[tuple[str, ...]]], list[str]]:
    """synthesiser_pronunciations in chunks, with a progress bar over the words."""
    from tqdm.auto import tqdm
    pronounced: dict[str, list[tuple[str, ...]]] = {}
    unpronounceable: list[str] = []
    with tqdm(total=len(words), desc="pronounce", unit="word", disable=not progress or not words,
              leave=False) as bar:
        for start in range(0, len(words), CHUNK_WORDS):
            chunk = words[start:start + CHUNK_WORDS]
            found, missing = synthesiser_pronunciations(chunk)
            pronounced.update(found)
            unpronounceable.extend(missing)
            bar.update(len(chunk))
    return pronounced, unpronounceable


def build_lexicon(texts: list[Path], out: Path, base: Path | None = None, weak_forms: int = WEAK_FORM_WORDS,
                  progress: bool = True) -> dict:
    """Writes `out`: the base lexicon plus the texts' words it lacks, pronounced; returns a summary
    (words, base_words, new_words, pronunciations of the new words, unpronounceable)."""
    if out.is_dir():
        raise TextFileError(f"--out {out} is a folder; give the lexicon file to write")
    base_lexicon = read_lexicon(base) if base is not None else {}
    # the new words are ARPABET_39: a base in another phone set would make a lexicon of two
    outside = sorted({phone for spellings in base_lexicon.values() for spelling in spellings
                      for phone in spelling} - set(ARPABET_39))
    if outside:
        raise LexiconFileError(f"--base {base} spells words with phones outside ARPABET_39 ({_examples(outside)}); "
                               "new words are pronounced in ARPABET_39 (CMUdict's 39 phones, the synth corpus's), "
                               "so the lexicon would mix two phone sets")
    counts = text_words(texts)
    # sorted, as the synth recipe pronounces its vocabulary: the synthesisers' choice between
    # homographs ("read" R IY D / R EH D) can depend on the neighbouring words of a run, so the
    # same set of words gets the same pronunciations whatever the order of the text
    new = sorted(word for word in counts if word not in base_lexicon)
    if new:
        check_pronouncing_programs()
    pronounced, unpronounceable = pronounce(new, progress)
    # weak forms as the synth recipe gives them, counted over the text's new words seen at least twice
    frequent = {word: pronounced[word] for word in pronounced if counts[word] >= WEAK_FORM_MIN_COUNT}
    add_weak_forms(frequent, list(Counter({word: counts[word] for word in frequent}).elements()), weak_forms)
    pronounced.update(frequent)
    lexicon = {**base_lexicon, **pronounced}
    if not lexicon:
        raise PronunciationError(f"no word of {', '.join(map(str, texts))} could be pronounced "
                                 f"({_examples(unpronounceable)}), and there is no --base: nothing to write")
    out.parent.mkdir(parents=True, exist_ok=True)
    write_lexicon(lexicon, out)
    return {"out": str(out), "words": len(lexicon), "text_words": len(counts),
            "base_words": len(base_lexicon), "new_words": len(pronounced),
            "new_pronunciations": sum(len(spellings) for spellings in pronounced.values()),
            "unpronounceable": unpronounceable}


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

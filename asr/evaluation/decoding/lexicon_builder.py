"""A lexicon for a user's own words: the words of a text (word lists or running text, normalised as
training transcripts are) that a base lexicon lacks, pronounced with the tools and the phone set of
the built-in corpus's training (asr.evaluation.decoding.pronunciation), written with the base's
words as `word PH ON ES` lines. As in the synth recipe's lexicon, the most frequent one-vowel new
words get their weak form too, counting only words the text holds at least twice. `python -m
asr.lexicon` is the command.
"""
from __future__ import annotations

from collections import Counter
from pathlib import Path

from asr.evaluation.decoding.lexicon import LexiconFileError, first_examples, read_lexicon, write_lexicon
from asr.evaluation.decoding.pronunciation import (WEAK_FORM_WORDS, PronunciationError, add_weak_forms,
                                                   check_pronouncing_programs, synthesiser_pronunciations)
from asr.text.normalisation import TextFileError, read_normalised_lines
from asr.text.phones import ARPABET_39

CHUNK_WORDS = 200            # words per call of the synthesisers (one progress step)
WEAK_FORM_MIN_COUNT = 2      # a word must occur this often in the text to get a weak form
# The longest word pronounced (English's longest dictionary words have 30-45 letters): a chunk of
# such words stays far below the 128 KiB the kernel allows one argument of the synthesisers.
MAX_WORD_LETTERS = 100


def text_words(paths: list[Path]) -> Counter:
    """word -> how often the texts hold it (normalised as transcripts), in first-seen order."""
    counts: Counter = Counter()
    for path in paths:
        for line in read_normalised_lines(path):
            words = line.split()
            longest = max(words, key=len, default="")
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
        raise LexiconFileError(f"--base {base} spells words with phones outside ARPABET_39 ({first_examples(outside)}); "
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
                                 f"({first_examples(unpronounceable)}), and there is no --base: nothing to write")
    out.parent.mkdir(parents=True, exist_ok=True)
    write_lexicon(lexicon, out)
    return {"out": str(out), "words": len(lexicon), "text_words": len(counts),
            "base_words": len(base_lexicon), "new_words": len(pronounced),
            "new_pronunciations": sum(len(spellings) for spellings in pronounced.values()),
            "unpronounceable": unpronounceable}

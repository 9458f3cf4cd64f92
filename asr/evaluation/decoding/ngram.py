"""Word n-gram language models: a modified Kneser-Ney estimator writing ARPA, and ARPA checks.

PyPI has no maintained n-gram estimator that installs as a wheel (the `kenlm` package is the
query side only, without `lmplz`; NLTK's KneserNeyInterpolated is unmodified KN without ARPA
output), and Debian ships no `lmplz`, so corpora without an LM (the synthetic one, a user's
own text) get one from `estimate_arpa` here: interpolated modified Kneser-Ney (Chen & Goodman
1998, as KenLM's lmplz), orders 1-4, no pruning, written as a backoff ARPA file.

- Every sentence is wrapped in <s> ... </s>. The highest order uses raw counts; lower orders use
  continuation counts (the number of distinct words seen before the n-gram), except n-grams that
  begin with <s>, which nothing can precede and which keep their raw counts.
- Discounts per order from the count-of-counts n1..n4 of that order's (adjusted) counts:
  Y = n1 / (n1 + 2 n2), D1 = 1 - 2Y n2/n1, D2 = 2 - 3Y n3/n2, D3+ = 3 - 4Y n4/n3. Where a
  count-of-count is 0 (tiny texts) the discounts fall back to 0.5, 1.0, 1.5.
- p(w | h) = (a(hw) - D(a(hw))) / a(h.) + gamma(h) p(w | h'), with
  gamma(h) = (D1 N1(h.) + D2 N2(h.) + D3+ N3+(h.)) / a(h.); the unigrams interpolate with the
  uniform distribution over the vocabulary (the words of the text, `vocabulary` words never seen
  in it, </s> and <unk>), so a closed vocabulary gets every word a probability.
- ARPA: log10 p(w | h) for each seen n-gram, and log10 gamma(hw) as the backoff weight of every
  n-gram that is the context of a longer one; p(<s>) is written as -99 (never predicted).

`build_lm` makes one from a user's own text (`python -m asr.build_lm`): the text normalised as
transcripts are, a lexicon's words added to the vocabulary, and a summary of the text's words the
lexicon lacks.
"""
from __future__ import annotations

import gzip
import io
import math
import os
import sys
import zlib
from collections import Counter, defaultdict
from pathlib import Path
from typing import Callable, Iterable

from asr.evaluation.decoding.lexicon import read_lexicon
from asr.text.normalisation import TextFileError, read_normalised_lines

SENTENCE_START, SENTENCE_END, UNKNOWN_WORD = "<s>", "</s>", "<unk>"
MAX_ORDER = 4
FALLBACK_DISCOUNTS = (0.5, 1.0, 1.5)


class LanguageModelError(ValueError):
    """An LM file that is missing or not ARPA, or text an LM cannot be estimated from."""


def discounts(counts: Iterable[int]) -> tuple[float, float, float]:
    """(D1, D2, D3+) of modified Kneser-Ney from the counts of one order."""
    n = [0, 0, 0, 0, 0]
    for count in counts:
        if 1 <= count <= 4:
            n[count] += 1
    if min(n[1:5]) == 0:
        return FALLBACK_DISCOUNTS
    y = n[1] / (n[1] + 2 * n[2])
    values = (1 - 2 * y * n[2] / n[1], 2 - 3 * y * n[3] / n[2], 3 - 4 * y * n[4] / n[3])
    if not all(0 < d <= k + 1 for k, d in enumerate(values)):
        return FALLBACK_DISCOUNTS
    return values


def estimate_ngram_probabilities(sentences: Iterable[str], order: int = 3,
                                 vocabulary: Iterable[str] = ()) -> list[dict[tuple[str, ...], tuple[float, float]]]:
    """Per order n (list index n - 1): n-gram -> (probability, backoff weight gamma) of
    interpolated modified Kneser-Ney; gamma is 1.0 for n-grams that are no context."""
    if not 1 <= order <= MAX_ORDER:
        raise LanguageModelError(f"LM order {order} is not supported; choose 1 to {MAX_ORDER}")
    raw: list[dict[tuple[str, ...], int]] = [defaultdict(int) for _ in range(order)]
    words_seen: set[str] = set()
    for sentence in sentences:
        words = sentence.split()
        if not words:
            continue
        words_seen.update(words)
        tokens = [SENTENCE_START] + words + [SENTENCE_END]
        for n in range(1, order + 1):
            for i in range(len(tokens) - n + 1):
                raw[n - 1][tuple(tokens[i:i + n])] += 1
    if not words_seen:
        raise LanguageModelError("no words to estimate an LM from (every sentence is empty)")
    raw[0].pop((SENTENCE_START,), None)
    # adjusted counts: continuation counts below the highest order, raw counts for <s>-initial n-grams
    adjusted: list[dict[tuple[str, ...], int]] = [dict(raw[order - 1])]
    for n in range(order - 1, 0, -1):
        continuation: dict[tuple[str, ...], int] = defaultdict(int)
        for gram in raw[n]:
            continuation[gram[1:]] += 1
        counts = {gram: (count if gram[0] == SENTENCE_START else continuation.get(gram, 0))
                  for gram, count in raw[n - 1].items()}
        adjusted.insert(0, {gram: count for gram, count in counts.items() if count > 0})
    vocab = sorted((words_seen | set(vocabulary) | {SENTENCE_END, UNKNOWN_WORD}) - {SENTENCE_START})
    probabilities: list[dict[tuple[str, ...], float]] = []
    gammas: list[dict[tuple[str, ...], float]] = []
    for n in range(1, order + 1):
        counts = adjusted[n - 1]
        d = discounts(counts.values())
        totals: dict[tuple[str, ...], int] = defaultdict(int)
        kinds: dict[tuple[str, ...], list[int]] = defaultdict(lambda: [0, 0, 0])
        for gram, count in counts.items():
            totals[gram[:-1]] += count
            kinds[gram[:-1]][min(count, 3) - 1] += 1
        gamma = {context: sum(dk * nk for dk, nk in zip(d, kinds[context])) / total
                 for context, total in totals.items()}
        gammas.append(gamma)
        probability: dict[tuple[str, ...], float] = {}
        grams = [(word,) for word in vocab] if n == 1 else list(counts)
        for gram in grams:
            count = counts.get(gram, 0)
            context = gram[:-1]
            discounted = max(count - d[min(count, 3) - 1], 0.0) / totals[context] if count else 0.0
            lower = (1.0 / len(vocab)) if n == 1 else _backoff_probability(gram[1:], probabilities, gammas)
            probability[gram] = discounted + gamma[context] * lower
        probabilities.append(probability)
    model = [{gram: (p, gammas[n + 1].get(gram, 1.0) if n + 1 < order else 1.0) for gram, p in probabilities[n].items()}
             for n in range(order)]
    # <s> is never predicted (probability 0, written as -99) but is the context of the first word
    model[0][(SENTENCE_START,)] = (0.0, gammas[1].get((SENTENCE_START,), 1.0) if order > 1 else 1.0)
    return model


def _backoff_probability(gram: tuple[str, ...], probabilities, gammas) -> float:
    """p(gram[-1] | gram[:-1]) from the lower orders already estimated (backing off as ARPA does)."""
    n = len(gram)
    if gram in probabilities[n - 1]:
        return probabilities[n - 1][gram]
    return gammas[n - 1].get(gram[:-1], 1.0) * _backoff_probability(gram[1:], probabilities, gammas)


def arpa_text(model: list[dict[tuple[str, ...], tuple[float, float]]]) -> str:
    """The ARPA file of `estimate_ngram_probabilities`'s output (tab-separated, as KenLM needs)."""
    order = len(model)
    sections = model
    out = io.StringIO()
    out.write("\\data\\\n")
    for n, section in enumerate(sections, 1):
        out.write(f"ngram {n}={len(section)}\n")
    for n, section in enumerate(sections, 1):
        out.write(f"\n\\{n}-grams:\n")
        for gram in sorted(section):
            probability, gamma = section[gram]
            logp = -99.0 if gram == (SENTENCE_START,) else math.log10(probability)
            line = f"{logp:.6f}\t{' '.join(gram)}"
            if n < order and gamma != 1.0:
                line += f"\t{math.log10(gamma):.6f}"
            out.write(line + "\n")
    out.write("\n\\end\\\n")
    return out.getvalue()


def estimate_arpa(sentences: Iterable[str], out_path: str | os.PathLike, order: int = 3,
                  vocabulary: Iterable[str] = ()) -> Path:
    """Estimates a modified Kneser-Ney LM of `order` on `sentences` (space-separated words) and
    writes it as ARPA to out_path (gzipped when it ends in .gz), atomically."""
    out_path = Path(out_path)
    text = arpa_text(estimate_ngram_probabilities(sentences, order, vocabulary))
    out_path.parent.mkdir(parents=True, exist_ok=True)
    partial = out_path.with_name(out_path.name + ".partial")
    if out_path.suffix == ".gz":
        with gzip.open(partial, "wt", encoding="utf-8") as handle:
            handle.write(text)
    else:
        partial.write_text(text, encoding="utf-8")
    os.replace(partial, out_path)
    return out_path


def open_text(path: Path, gzipped: bool | None = None):
    """A text handle on a plain or gzipped file (by its suffix unless `gzipped` says)."""
    gzipped = path.suffix == ".gz" if gzipped is None else gzipped
    return gzip.open(path, "rt", encoding="utf-8") if gzipped else open(path, encoding="utf-8")


def read_arpa_vocabulary(path: str | os.PathLike, gzipped: bool | None = None) -> tuple[set[str], list[int]]:
    """(the unigram words, the n-gram counts of the header) of an ARPA file (.arpa or .arpa.gz);
    LanguageModelError naming the file and line when it is missing or not ARPA. Reads only the
    header and the unigrams, so it is quick on LibriSpeech-sized files."""
    path = Path(path)
    if not path.is_file():
        raise LanguageModelError(f"LM file {path} does not exist; give lm=PATH to an ARPA file (.arpa or .arpa.gz)")
    counts: list[int] = []
    words: set[str] = set()
    section = None
    try:
        with open_text(path, gzipped) as handle:
            for number, raw_line in enumerate(handle, 1):
                line = raw_line.strip()
                if not line:
                    continue
                if section is None:
                    if line != "\\data\\":
                        raise LanguageModelError(f"LM file {path} is not ARPA: line {number} is {line[:60]!r}, "
                                                 "an ARPA file begins with \\data\\")
                    section = "data"
                elif section == "data" and line.startswith("ngram "):
                    try:
                        counts.append(int(line.split("=", 1)[1]))
                    except (IndexError, ValueError):
                        raise LanguageModelError(f"LM file {path}, line {number}: {line[:60]!r} is not "
                                                 "'ngram N=COUNT'") from None
                elif line == "\\1-grams:":
                    section = "1-grams"
                elif section == "1-grams":
                    if line.startswith("\\"):
                        break
                    fields = line.split()
                    try:
                        float(fields[0])
                        words.add(fields[1])
                    except (IndexError, ValueError):
                        raise LanguageModelError(f"LM file {path}, line {number}: {line[:60]!r} is not a "
                                                 "unigram line 'LOG10PROB WORD [BACKOFF]'") from None
                elif section == "data":
                    raise LanguageModelError(f"LM file {path}, line {number}: {line[:60]!r} where the "
                                             "header's 'ngram N=COUNT' lines or \\1-grams: should be")
    except (OSError, EOFError, UnicodeDecodeError, zlib.error) as error:   # zlib: a damaged .gz past its header
        raise LanguageModelError(f"LM file {path} cannot be read as ARPA text ({error})") from None
    if section is None:
        raise LanguageModelError(f"LM file {path} is empty; give an ARPA file (.arpa or .arpa.gz)")
    if not counts or not words:
        raise LanguageModelError(f"LM file {path} has no {'header counts' if not counts else 'unigrams'}; "
                                 "it is not a complete ARPA file")
    if len(words) != counts[0]:
        raise LanguageModelError(f"LM file {path}: the header says {counts[0]} unigrams but the file has "
                                 f"{len(words)} (a truncated or hand-edited file?)")
    return words, counts


# ---- a user's own text to an LM (python -m asr.build_lm) ----------------------------------------------
def read_sentences(paths: list[Path], progress: bool) -> list[str]:
    """The lines of `paths` normalised as transcripts, one sentence each; TextFileError when they hold no words."""
    from tqdm.auto import tqdm
    sentences: list[str] = []
    for path in tqdm(paths, desc="read text", unit="file", disable=not progress or len(paths) < 2, leave=False):
        sentences.extend(read_normalised_lines(path))
    if not sentences:
        raise TextFileError(f"no words in {', '.join(str(p) for p in paths)} (after normalisation to lowercase "
                            "a-z and apostrophes): nothing to estimate an LM from")
    return sentences


def build_lm(texts: list[Path], out: Path, lexicon: Path | None = None, order: int = 3, progress: bool = True,
             announce: Callable[[str], None] = lambda message: print(message, file=sys.stderr)) -> dict:
    """Writes the LM of `texts` (one sentence per line, normalised as transcripts) over their words and
    the lexicon's; returns a summary: sentences, words, vocabulary, ngrams (per order), and the
    text's words outside the lexicon (distinct, their share of the text's words, the most frequent).
    `announce` gets the line that says the estimation starts (with `progress`)."""
    if not 2 <= order <= MAX_ORDER:
        raise LanguageModelError(f"--order {order}: choose 2 to {MAX_ORDER} (the decoder's KenLM needs 2 or more)")
    if out.is_dir():
        raise TextFileError(f"--out {out} is a folder; give the ARPA file to write (e.g. {out / 'lm.arpa.gz'})")
    words = sorted(read_lexicon(lexicon)) if lexicon is not None else []
    sentences = read_sentences(texts, progress)
    counts = Counter(word for sentence in sentences for word in sentence.split())
    if progress:
        announce(f"estimating a {order}-gram LM on {len(sentences)} sentences")
    estimate_arpa(sentences, out, order=order, vocabulary=words)
    vocabulary, ngrams = read_arpa_vocabulary(out)
    known = set(words)
    outside = Counter({word: count for word, count in counts.items() if word not in known}) if lexicon else Counter()
    return {"out": str(out), "sentences": len(sentences), "words": sum(counts.values()),
            "text_vocabulary": len(counts), "vocabulary": len(vocabulary), "ngrams": ngrams,
            "lexicon": str(lexicon) if lexicon else None, "lexicon_words": len(words),
            "lexicon_words_not_in_text": len(known - set(counts)),
            "outside_lexicon": len(outside), "outside_lexicon_share": sum(outside.values()) / sum(counts.values()),
            "outside_lexicon_words": [word for word, _ in outside.most_common(10)]}

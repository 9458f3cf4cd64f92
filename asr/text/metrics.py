"""Error rates over a whole set of utterances, with jiwer's edit-distance alignment.

Every rate is corpus-level: (substitutions + deletions + insertions) summed over all
utterances, divided by the number of reference tokens summed over all utterances
(not a mean of per-utterance rates). Rates are fractions (0.12 = 12 %) and can exceed 1
when the hypotheses insert much. utterance_phone_errors gives the per-utterance counts behind a PER,
and paired_bootstrap_gap how far the gap between two scorings of the same utterances can be trusted.
Tokens are:

- phone_error_rate: whitespace-separated phones ("DH AH K AE T"); with phone_set="timit61" both
  sides are first folded from TIMIT's 61 symbols to Lee & Hon's 39 classes (the standard TIMIT
  scoring: models train on 61, PER is reported on 39);
- word_error_rate:  whitespace-separated words;
- char_error_rate:  characters, spaces included (jiwer's convention), after collapsing
  runs of whitespace to one space and stripping both ends.
"""
from __future__ import annotations

from typing import Sequence

import jiwer
import numpy as np

from asr.text.phones import PHONE_SETS


def percent(rate: float | None) -> str:
    """A rate for people: 0.1234 -> '12.34%', None (not scored) -> 'n/a'."""
    return "n/a" if rate is None else f"{100 * rate:.2f}%"


def _check(references: Sequence[str], hypotheses: Sequence[str]) -> tuple[list[str], list[str]]:
    references, hypotheses = list(references), list(hypotheses)
    if len(references) != len(hypotheses):
        raise ValueError(f"got {len(references)} references but {len(hypotheses)} hypotheses; "
                         "they must pair up one to one")
    return references, hypotheses


def _rate(output, what: str) -> float:
    reference_tokens = output.hits + output.substitutions + output.deletions
    if reference_tokens == 0:
        raise ValueError(f"the references hold no {what}s, so the {what} error rate is undefined")
    return (output.substitutions + output.deletions + output.insertions) / reference_tokens


def _token_error_rate(references: Sequence[str], hypotheses: Sequence[str], what: str) -> float:
    references, hypotheses = _check(references, hypotheses)
    if not references:
        raise ValueError(f"no utterances to compute a {what} error rate on")
    # jiwer refuses an empty *reference* string; an utterance with no reference tokens
    # still counts its hypothesis tokens as insertions, so score those by hand.
    insertions = sum(len(h.split()) for r, h in zip(references, hypotheses) if not r.split())
    kept = [(r, h) for r, h in zip(references, hypotheses) if r.split()]
    if not kept:
        raise ValueError(f"the references hold no {what}s, so the {what} error rate is undefined")
    output = jiwer.process_words([r for r, _ in kept], [h for _, h in kept])
    output.insertions += insertions
    return _rate(output, what)


def phone_error_rate(references: Sequence[str], hypotheses: Sequence[str], phone_set: str = "arpabet39") -> float:
    """PER over space-separated phone strings of `phone_set` (the phones tokenizer's `.phone_set`).

    For "timit61" references and hypotheses are folded to Lee & Hon's 39 classes before the
    alignment (closures/pauses -> SIL, Q deleted, AO -> AA, ...), so e.g. a hypothesis IX for a
    reference IH is no error. A symbol outside TIMIT's 61 is a ValueError naming it.
    """
    return _token_error_rate(*_scored_phones(references, hypotheses, phone_set), "phone")


def _scored_phones(references: Sequence[str], hypotheses: Sequence[str], phone_set: str) -> tuple[list, list]:
    """The references and hypotheses as PER scores them: paired one to one, and for "timit61" folded."""
    if phone_set not in PHONE_SETS:
        raise ValueError(f"phone_set={phone_set!r} has no PER scoring; known: {', '.join(PHONE_SETS)}")
    references, hypotheses = _check(references, hypotheses)
    fold = PHONE_SETS[phone_set].scoring_fold   # TIMIT's 61 symbols: folded to 39 classes on both sides
    if fold is not None:
        references, hypotheses = [fold(r) for r in references], [fold(h) for h in hypotheses]
    return references, hypotheses


def word_error_rate(references: Sequence[str], hypotheses: Sequence[str]) -> float:
    """WER over space-separated word strings."""
    return _token_error_rate(references, hypotheses, "word")


def char_error_rate(references: Sequence[str], hypotheses: Sequence[str]) -> float:
    """CER over characters (spaces count as characters)."""
    references, hypotheses = _check(references, hypotheses)
    if not references:
        raise ValueError("no utterances to compute a character error rate on")
    references = [" ".join(r.split()) for r in references]
    hypotheses = [" ".join(h.split()) for h in hypotheses]
    insertions = sum(len(h) for r, h in zip(references, hypotheses) if not r)
    kept = [(r, h) for r, h in zip(references, hypotheses) if r]
    if not kept:
        raise ValueError("the references hold no characters, so the character error rate is undefined")
    output = jiwer.process_characters([r for r, _ in kept], [h for _, h in kept])
    output.insertions += insertions
    return _rate(output, "character")


def out_of_vocabulary_rate(references: Sequence[str], vocabulary) -> float | None:
    """The share of reference word tokens (space-separated) outside `vocabulary` (a set of
    words): 'the cat' against {'the'} is 0.5. None when the references hold no words."""
    words = [word for reference in references for word in reference.split()]
    if not words:
        return None
    return sum(word not in vocabulary for word in words) / len(words)


def utterance_phone_errors(references: Sequence[str], hypotheses: Sequence[str],
                           phone_set: str = "arpabet39") -> list[tuple[int, int]]:
    """(edits, reference phones) of each utterance, scored as phone_error_rate scores the set: their
    sums' ratio is its PER. An empty reference counts its hypothesis's phones as edits."""
    references, hypotheses = _scored_phones(references, hypotheses, phone_set)
    counts = [(len(h.split()), 0) for h in hypotheses]
    kept = [i for i, r in enumerate(references) if r.split()]
    if kept:
        output = jiwer.process_words([references[i] for i in kept], [hypotheses[i] for i in kept])
        for i, chunks in zip(kept, output.alignments):
            edits = sum(max(c.ref_end_idx - c.ref_start_idx, c.hyp_end_idx - c.hyp_start_idx)
                        for c in chunks if c.type != "equal")
            counts[i] = (edits, len(references[i].split()))
    return counts


def paired_bootstrap_gap(base: Sequence[tuple[int, int]], other: Sequence[tuple[int, int]], samples: int = 1000,
                         confidence: float = 0.95, seed: int = 0) -> tuple[float, float, float]:
    """(gap, low, high): the error rate of `other` minus that of `base`, two scorings of the same
    utterances ((edits, reference tokens) each, e.g. utterance_phone_errors), and the central
    `confidence` interval of that gap over `samples` resamplings of the utterances (with replacement,
    the same draw for both: a paired bootstrap). A gap whose interval holds 0 is one these utterances
    cannot tell from none."""
    if len(base) != len(other) or not base:
        raise ValueError(f"got {len(base)} and {len(other)} utterances: the two scorings must be of the "
                         "same utterances, at least one")
    if [tokens for _, tokens in base] != [tokens for _, tokens in other]:
        raise ValueError("the two scorings count other reference tokens: they are not of the same references")
    edits = np.asarray([[e for e, _ in base], [e for e, _ in other]], dtype=np.float64)
    tokens = np.asarray([t for _, t in base], dtype=np.float64)
    if tokens.sum() == 0:
        raise ValueError("the references hold no tokens, so the error rates are undefined")
    gap = float((edits[1].sum() - edits[0].sum()) / tokens.sum())
    draws = np.random.default_rng(seed).integers(0, len(tokens), size=(samples, len(tokens)))
    sampled_tokens = tokens[draws].sum(axis=1)
    sampled = (edits[1][draws].sum(axis=1) - edits[0][draws].sum(axis=1)) / np.maximum(sampled_tokens, 1)
    low, high = np.quantile(sampled, [(1 - confidence) / 2, (1 + confidence) / 2])
    return gap, float(low), float(high)

"""Error rates over a whole set of utterances, with jiwer's edit-distance alignment.

Every rate is corpus-level: (substitutions + deletions + insertions) summed over all
utterances, divided by the number of reference tokens summed over all utterances
(not a mean of per-utterance rates). Rates are fractions (0.12 = 12 %) and can exceed 1
when the hypotheses insert much. Tokens are:

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
    if phone_set not in PHONE_SETS:
        raise ValueError(f"phone_set={phone_set!r} has no PER scoring; known: {', '.join(PHONE_SETS)}")
    fold = PHONE_SETS[phone_set].scoring_fold   # TIMIT's 61 symbols: folded to 39 classes on both sides
    if fold is not None:
        references, hypotheses = _check(references, hypotheses)
        references, hypotheses = [fold(r) for r in references], [fold(h) for h in hypotheses]
    return _token_error_rate(references, hypotheses, "phone")


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

"""Greedy CTC decoding, prefix beam search and the error rates, against hand-worked answers
and brute-force enumeration."""
import itertools
import math

import numpy as np
import pytest
import torch

from asr.text.metrics import (char_error_rate, paired_bootstrap_gap, percent, phone_error_rate, utterance_phone_errors,
                              word_error_rate)
from asr.model.ctc import CTCHeads, ctc_loss, greedy_decode, prefix_beam_search


def one_hot_scores(paths, vocab=5):
    """(B, T, V) scores whose argmax per frame is the given path (padded with -1 -> blank)."""
    length = max(len(p) for p in paths)
    scores = torch.full((len(paths), length, vocab), -5.0)
    for b, path in enumerate(paths):
        for t, token in enumerate(path):
            scores[b, t, token] = 0.0
    return scores


def test_greedy_decode_merges_repeats_then_drops_blanks():
    # frames:  a a _ a b b _ _ c   -> a a b c  (the blank separates the two a's)
    # frames:  _ _ _               -> nothing
    # frames:  c c c | padding b b (length 3: frames past the length are ignored) -> c
    paths = [[1, 1, 0, 1, 2, 2, 0, 0, 3], [0, 0, 0], [3, 3, 3, 2, 2]]
    scores = one_hot_scores(paths)
    decoded = greedy_decode(scores, torch.tensor([9, 3, 3]))
    assert decoded == [[1, 1, 2, 3], [], [3]]


def test_greedy_decode_of_zero_length_utterance_is_empty():
    assert greedy_decode(one_hot_scores([[1, 2]]), torch.tensor([0])) == [[]]


def brute_force_best_labelling(log_probs: torch.Tensor) -> tuple[list[int], float]:
    """Sums the probability of every alignment (all V^T paths) per collapsed labelling."""
    frames, vocabulary = log_probs.shape
    totals: dict[tuple[int, ...], float] = {}
    for path in itertools.product(range(vocabulary), repeat=frames):
        labelling = tuple(s for i, s in enumerate(path) if s != 0 and (i == 0 or s != path[i - 1]))
        probability = math.exp(sum(float(log_probs[t, s]) for t, s in enumerate(path)))
        totals[labelling] = totals.get(labelling, 0.0) + probability
    best = max(totals, key=totals.get)
    return list(best), totals[best]


@pytest.mark.parametrize("seed", range(6))
def test_prefix_beam_search_with_a_full_beam_finds_the_most_probable_labelling(seed):
    generator = torch.Generator().manual_seed(seed)
    # peaked, random frames: best path and best labelling often differ
    log_probs = torch.log_softmax(2.0 * torch.randn(6, 4, generator=generator), dim=-1)
    expected, _ = brute_force_best_labelling(log_probs)
    assert prefix_beam_search(log_probs, 6, beam_size=4 ** 6) == expected


def test_prefix_beam_search_needs_a_blank_between_repeats_and_ignores_padding():
    blank, a = 0, 1
    # frames: a a blank a | padding that would add a's
    log_probs = torch.log(torch.tensor([[0.01, 0.98, 0.01], [0.01, 0.98, 0.01], [0.98, 0.01, 0.01],
                                        [0.01, 0.98, 0.01], [0.01, 0.98, 0.01], [0.98, 0.01, 0.01]]))
    assert prefix_beam_search(log_probs, 4, beam_size=3) == [a, a]
    assert prefix_beam_search(log_probs, 2, beam_size=3) == [a]
    assert prefix_beam_search(log_probs, 0, beam_size=3) == []
    with pytest.raises(ValueError, match="beam_size"):
        prefix_beam_search(log_probs, 4, beam_size=0)


def test_ctc_loss_matches_hand_computed_probability():
    # T=2 frames, vocabulary {blank, a}, target "a": alignments a_, _a, aa.
    p = torch.tensor([[0.6, 0.4], [0.3, 0.7]])           # p[t, token]
    expected = p[0, 1] * p[1, 0] + p[0, 0] * p[1, 1] + p[0, 1] * p[1, 1]
    loss = ctc_loss(p.log()[None], torch.tensor([2]), torch.tensor([[1]]), torch.tensor([1]))
    # reduction "mean": divided by the target length (1)
    assert loss.item() == pytest.approx(-math.log(expected.item()), rel=1e-5)


def test_ctc_loss_zeroes_impossible_alignments():
    # 3 targets cannot be aligned to 2 frames: zero_infinity makes that utterance contribute 0.
    log_probs = torch.log_softmax(torch.randn(1, 2, 4), dim=-1)
    loss = ctc_loss(log_probs, torch.tensor([2]), torch.tensor([[1, 2, 3]]), torch.tensor([3]))
    assert loss.item() == 0.0


def test_heads_give_log_probabilities_per_kind_in_order():
    heads = CTCHeads(8, {"phones": 40, "chars": 29})
    out = heads(torch.randn(2, 5, 8))
    assert list(out) == ["phones", "chars"] == heads.kinds
    assert out["phones"].shape == (2, 5, 40) and out["chars"].shape == (2, 5, 29)
    torch.testing.assert_close(out["chars"].exp().sum(-1), torch.ones(2, 5))


def test_phone_error_rate_counts_edits_over_all_reference_phones():
    # utt 1: "AH B K" vs "AH K" -> 1 deletion; utt 2: "S T" vs "S T IY OW" -> 2 insertions;
    # utt 3: "N" vs "M" -> 1 substitution. 4 edits / 6 reference phones.
    refs = ["AH B K", "S T", "N"]
    hyps = ["AH K", "S T IY OW", "M"]
    assert phone_error_rate(refs, hyps) == pytest.approx(4 / 6)


def test_word_error_rate_and_empty_cases():
    assert word_error_rate(["the cat sat", "a dog"], ["the cat sat", "a dog"]) == 0.0
    # "the cat sat" -> "cat sat down": delete "the", insert "down" = 2 edits over 3 words
    assert word_error_rate(["the cat sat"], ["cat sat down"]) == pytest.approx(2 / 3)
    # an empty hypothesis deletes every word; an empty reference counts hypothesis words as insertions
    assert word_error_rate(["one two", ""], ["", "extra"]) == pytest.approx(3 / 2)
    with pytest.raises(ValueError, match="2 references but 1 hypotheses"):
        word_error_rate(["a", "b"], ["a"])
    with pytest.raises(ValueError, match="no words"):
        word_error_rate([""], ["x"])


def test_char_error_rate_counts_spaces_as_characters():
    # "ab cd" (5 chars) vs "abcd": one deleted space -> 1/5; "xy" vs "xz": 1 substitution / 2.
    assert char_error_rate(["ab cd"], ["abcd"]) == pytest.approx(1 / 5)
    assert char_error_rate(["ab cd", "xy"], ["abcd", "xz"]) == pytest.approx(2 / 7)
    # runs of spaces collapse before scoring
    assert char_error_rate(["ab  cd "], [" ab cd"]) == 0.0


def test_percent_formats_a_rate_for_people():
    assert percent(0.1234) == "12.34%" and percent(1.5) == "150.00%" and percent(0.0) == "0.00%"
    assert percent(None) == "n/a"


def test_utterance_phone_errors_sum_to_the_corpus_per():
    rng = np.random.default_rng(0)
    phones = ["AA", "B", "K", "S", "IY"]
    references = [" ".join(rng.choice(phones, size=rng.integers(0, 8))) for _ in range(40)]
    hypotheses = [" ".join(rng.choice(phones, size=rng.integers(0, 8))) for _ in range(40)]
    counts = utterance_phone_errors(references, hypotheses)
    assert sum(e for e, _ in counts) / sum(t for _, t in counts) == pytest.approx(
        phone_error_rate(references, hypotheses))
    # by hand: one substitution and one insertion; a deletion; an empty reference's insertion
    assert utterance_phone_errors(["AH B K", "D", ""], ["AH X K Y", "", "Z"]) == [(2, 3), (1, 1), (1, 0)]
    # TIMIT's 61 symbols are folded as phone_error_rate folds them: IX for IH is no error
    assert utterance_phone_errors(["IH T"], ["IX T"], "timit61") == [(0, 2)]


def test_paired_bootstrap_gap_resamples_utterances_in_pairs():
    base = [(1, 10), (0, 4), (3, 6), (2, 5)]
    other = [(2, 10), (1, 4), (3, 6), (5, 5)]
    gap, low, high = paired_bootstrap_gap(base, other, samples=500, seed=3)
    assert gap == pytest.approx((11 - 6) / 25)
    # brute force: the same draws, each resampled set's two rates subtracted
    draws = np.random.default_rng(3).integers(0, 4, size=(500, 4))
    sampled = [sum(other[i][0] - base[i][0] for i in draw) / sum(base[i][1] for i in draw) for draw in draws]
    assert (low, high) == pytest.approx(tuple(np.quantile(sampled, [0.025, 0.975])))
    assert low <= gap <= high
    # one more edit in every utterance of equal length: every resampling gives the same gap
    same_length = [(0, 5)] * 6
    assert paired_bootstrap_gap(same_length, [(1, 5)] * 6) == pytest.approx((0.2, 0.2, 0.2))
    with pytest.raises(ValueError, match="same utterances"):
        paired_bootstrap_gap(base, other[:3])
    with pytest.raises(ValueError, match="other reference tokens"):
        paired_bootstrap_gap(base, [(0, 1)] * 4)

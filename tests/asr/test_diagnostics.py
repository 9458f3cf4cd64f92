"""asr.model.diagnostics: attention entropy, locality and cluster spread against hand-made cases, and the
CSV a tiny run writes."""
from __future__ import annotations

import csv
import itertools
import math
import statistics

import pytest
import torch

from asr.model.diagnostics import attention_entropy, attention_locality, cluster_time_spread, clustering_error
from asr.training.fit import train
from tiny_runs import tiny_config


def test_identical_keys_give_uniform_attention():
    q = torch.randn(1, 2, 5, 4)
    k = torch.ones(1, 2, 5, 4)                      # every key the same: every logit equal
    assert math.isclose(float(attention_entropy(q, k, torch.tensor([5]), shared_qk=False)), 1.0, rel_tol=1e-5)


def test_one_dominant_key_gives_entropy_near_zero():
    q = torch.zeros(1, 1, 4, 2)
    q[..., 0] = 100.0
    k = torch.zeros(1, 1, 4, 2)
    k[0, 0, 2, 0] = 10.0                            # logit 1000 / sqrt(2) for key 2, 0 for the others
    assert float(attention_entropy(q, k, torch.tensor([4]), shared_qk=False)) < 1e-6


def test_entropy_counts_valid_keys_only_and_skips_padded_queries():
    q = torch.randn(2, 1, 6, 3)
    k = torch.ones(2, 1, 6, 3)
    k[1, :, 3:] = 1e3 * torch.randn(1, 3, 3)        # padded keys of sequence 1: would not be uniform
    lengths = torch.tensor([6, 3])
    assert math.isclose(float(attention_entropy(q, k, lengths, shared_qk=False)), 1.0, rel_tol=1e-5)


def test_shared_qk_entropy_uses_unit_keys_and_no_self():
    """Brute force for one sequence: keys q / |q|, the diagonal masked, entropy over the L - 1 others."""
    q = torch.randn(1, 1, 5, 4)
    keys = q / q.norm(dim=-1, keepdim=True)
    logits = (q @ keys.transpose(-1, -2))[0, 0] / 2.0
    logits.fill_diagonal_(float("-inf"))
    p = logits.softmax(-1)
    entropy = -(p * p.clamp(min=1e-30).log()).sum(-1) / math.log(4)
    expected = float(entropy.mean())
    got = float(attention_entropy(q, q, torch.tensor([5]), shared_qk=True))
    assert math.isclose(got, expected, rel_tol=1e-5)


def mean_locality(q, k, lengths, radius):
    shares, counted = attention_locality(q, k, lengths, False, (radius,))
    return float(shares[0][counted].mean())


def test_attention_on_itself_is_all_within_any_radius():
    q = 100.0 * torch.eye(12).expand(1, 2, 12, 12)     # query i's only large score is key i
    assert mean_locality(q, q, torch.tensor([12]), 0) == pytest.approx(1.0)


def test_attention_ten_positions_ahead_is_outside_5_and_inside_20():
    """Query i attends to key (i + 10) mod 30 alone: 10 positions ahead, or 20 behind at the end."""
    length = 30
    q = 100.0 * torch.eye(length)[None, None]
    k = 100.0 * torch.roll(torch.eye(length), shifts=10, dims=0)[None, None]   # key j is e_(j - 10)
    lengths = torch.tensor([length])
    assert mean_locality(q, k, lengths, 5) == pytest.approx(0.0, abs=1e-6)
    assert mean_locality(q, k, lengths, 19) == pytest.approx(20 / 30, abs=1e-6)
    assert mean_locality(q, k, lengths, 20) == pytest.approx(1.0)


def test_uniform_attention_shares_count_the_valid_keys_near_each_query():
    """Identical keys: each valid query's share within r is (valid keys within r) / length, counted
    here by hand; padded keys and queries take no part."""
    q = torch.randn(2, 3, 16, 4)
    k = torch.ones(2, 3, 16, 4)
    k[1, :, 9:] = 1e3 * torch.randn(3, 7, 4)          # padded keys of sequence 1: would take the mass
    lengths = torch.tensor([16, 9])
    for radius in (0, 2, 5):
        expected = [sum(abs(i - j) <= radius for j in range(length)) / length
                    for length in (16, 9) for _ in range(3) for i in range(length)]
        assert mean_locality(q, k, lengths, radius) == pytest.approx(sum(expected) / len(expected), rel=1e-5)


def test_cluster_spread_is_the_size_weighted_standard_deviation_of_the_members_positions():
    assignment = torch.tensor([[[0, 0, 1, 1, 0, 1, -1, -1], [2, 2, 2, 2, 2, 2, -1, -1]],
                               [[0, 1, 0, 1, -1, -1, -1, -1], [3, 3, 3, 0, -1, -1, -1, -1]]])
    lengths = torch.tensor([6, 4])
    clusters = {}                                     # (batch, head, id) -> member positions
    for b, h, i in itertools.product(*map(range, assignment.shape)):
        if assignment[b, h, i] >= 0:
            clusters.setdefault((b, h, int(assignment[b, h, i])), []).append(i)
    spread = sum(len(members) * statistics.pstdev(members) for members in clusters.values())
    fraction = sum(len(members) * statistics.pstdev(members) / int(lengths[b]) for (b, _, _), members in clusters.items())
    got = cluster_time_spread(assignment, lengths)
    assert got[2] == 6 + 6 + 4 + 4
    assert got[0] == pytest.approx(spread) and got[1] == pytest.approx(fraction)
    # one cluster spanning 0..5 evenly: sqrt(35 / 12); the two interleaved ones of sequence 1: 1 each
    assert statistics.pstdev(clusters[0, 1, 2]) == pytest.approx(math.sqrt(35 / 12))


def test_the_clustering_errors_are_those_of_what_clustered_attention_gives(monkeypatch):
    """With one-hot values (v = the identity over positions), clustered attention's output row for a
    query is the weights it gives that query: the weight error is their total variation from exact
    attention, on the same clusters (the same draws); with other values, the output error is the
    relative distance of its output from exact attention's. Padded queries are left out."""
    import attention_ext.attentions.clustered as clustered
    from attention_ext import ClusteredAttention
    torch.manual_seed(3)
    batch, heads, length, dim = 2, 2, 12, 8
    q, k, v = (torch.randn(batch, heads, length, dim) for _ in range(3))
    lengths = torch.tensor([12, 9])
    one_hot = torch.eye(length).expand(batch, heads, length, length).contiguous()
    assignments = []
    original = clustered.cluster_queries

    def recorded(*args):
        clusters = original(*args)
        assignments.append(clusters.assignment)
        return clusters

    monkeypatch.setattr(clustered, "cluster_queries", recorded)
    attention = ClusteredAttention(clusters=3, bits=16, iterations=5)
    torch.manual_seed(0)
    shared = attention(q, k, one_hot, lengths)                                # (B, H, N, N): the weights
    torch.manual_seed(0)
    output = attention(q, k, v, lengths)
    assert torch.equal(assignments[0], assignments[1])                        # the same clusters both times
    weights, moved, count = 0.0, 0.0, 0
    for b, h in itertools.product(range(batch), range(heads)):
        n = int(lengths[b])
        exact = torch.softmax(q[b, h, :n] @ k[b, h, :n].T / math.sqrt(dim), dim=-1)
        weights += float(0.5 * (exact - shared[b, h, :n, :n]).abs().sum())
        exact_output = exact @ v[b, h, :n]
        moved += float(((exact_output - output[b, h, :n]).norm(dim=-1) / exact_output.norm(dim=-1)).sum())
        count += n
    got = clustering_error(q, k, v, lengths, False, assignments[0])
    assert got["weights"][1] == got["output"][1] == count
    assert got["weights"][0] == pytest.approx(weights, rel=1e-4) and got["output"][0] == pytest.approx(moved, rel=1e-4)
    assert 0 < weights / count < 1 and moved > 0
    # every query alone in its cluster: the centroid is the query, nothing changes
    alone = torch.arange(length).expand(batch, heads, length).masked_fill(torch.arange(length) >= lengths[:, None, None], -1)
    assert clustering_error(q, k, v, lengths, False, alone)["weights"][0] == pytest.approx(0.0, abs=1e-5)
    assert clustering_error(q, k, v, lengths, False, alone)["output"][0] == pytest.approx(0.0, abs=1e-4)


def test_a_run_with_diagnostics_writes_one_row_per_interval(tiny_synth, tmp_path):
    cfg = tiny_config(tiny_synth, "conf=synth_shared_full", "trainer.diagnostics_every_n_steps=1", "test=false")
    results = train(cfg, tmp_path / "run")
    with open(tmp_path / "run" / "diagnostics.csv", newline="") as handle:
        rows = list(csv.DictReader(handle))
    assert [int(row["step"]) for row in rows] == list(range(results["steps"]))
    for row in rows:
        assert 0.0 <= float(row["entropy/layer0"]) <= 1.0 + 1e-6
        assert float(row["grad_norm/layer0"]) > 0 and float(row["query_norm/layer0"]) > 0
        assert math.isfinite(float(row["loss"]))

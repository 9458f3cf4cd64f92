"""Full, clustered, i-clustered and oracle-top in the Reformer key form (unit keys, no attention to
self) against dense probability math written here, loop by loop."""
import math

import pytest
import torch

from attention_ext import (AttentionConfigError, SharedFullAttention, SharedQKRequiredError, build_in_reformer_form,
                           parse_attention_spec, runs_in_reformer_form)
from attention_ext.attentions.clustered import cluster_queries

from test_shared_full import dense_shared_full


def dense_reformer_rows(q, v, lengths, assignment, topk=None):
    """Per query: its cluster's attention over the unit keys (A^c, or with topk the i-clustered
    weights m_j softmax_T(q_i . k) on the cluster's top-k keys T and A^c elsewhere), as probabilities;
    then its own key's weight removed and the rest renormalised (kept when it is alone)."""
    batch, heads, length, dim = q.shape
    out = torch.zeros(batch, heads, length, v.shape[-1], dtype=q.dtype)
    for b in range(batch):
        valid = int(lengths[b])
        for h in range(heads):
            keys = [q[b, h, j] / q[b, h, j].norm() for j in range(valid)]
            for i in range(valid):
                cluster = int(assignment[b, h, i])
                members = [m for m in range(valid) if int(assignment[b, h, m]) == cluster]
                centroid = sum(q[b, h, m] for m in members) / len(members)
                a_c = torch.softmax(torch.stack([centroid @ key for key in keys]) / math.sqrt(dim), dim=0)
                weights = [float(a) for a in a_c]
                if topk is not None:
                    top = sorted(range(valid), key=lambda j: (-weights[j], j))[:topk]
                    mass = sum(weights[j] for j in top)
                    exact = torch.softmax(torch.stack([q[b, h, i] @ keys[j] for j in top]) / math.sqrt(dim), dim=0)
                    for j, w in zip(top, exact):
                        weights[j] = mass * float(w)
                if valid > 1:
                    weights[i] = 0.0
                total = sum(weights)
                out[b, h, i] = sum(w / total * v[b, h, j] for j, w in enumerate(weights))
    return out


def dense_oracle_top_without_self(q, v, lengths, topk):
    """Per query: shared_full's scores over the other valid keys, the topk largest kept, softmax."""
    batch, heads, length, dim = q.shape
    out = torch.zeros(batch, heads, length, v.shape[-1], dtype=q.dtype)
    for b in range(batch):
        valid = int(lengths[b])
        for h in range(heads):
            keys = [q[b, h, j] / q[b, h, j].norm() for j in range(valid)]
            for i in range(valid):
                others = [j for j in range(valid) if j != i] or [i]
                scores = {j: float(q[b, h, i] @ keys[j]) / math.sqrt(dim) for j in others}
                kept = sorted(others, key=lambda j: -scores[j])[:topk]
                weights = torch.softmax(torch.tensor([scores[j] for j in kept], dtype=q.dtype), dim=0)
                out[b, h, i] = sum(w * v[b, h, j] for w, j in zip(weights, kept))
    return out


def inputs(seed, batch=3, heads=2, length=7, dim=4):
    generator = torch.Generator().manual_seed(seed)
    q = torch.randn(batch, heads, length, dim, dtype=torch.float64, generator=generator)
    v = torch.randn(batch, heads, length, 3, dtype=torch.float64, generator=generator)
    return q, v


def run_with_clusters(module, q, v, lengths, seed=0):
    """The module's output and the clustering it drew (the same seed: the same draws)."""
    torch.manual_seed(seed)
    out = module(q, q, v, lengths)
    torch.manual_seed(seed)
    assignment = cluster_queries(q, lengths, module.clusters, module.bits, module.iterations).assignment
    return out, assignment


def test_full_in_the_trained_key_form_is_shared_full():
    module = build_in_reformer_form(parse_attention_spec("full"))
    assert isinstance(module, SharedFullAttention)
    q, v = inputs(0)
    lengths = torch.tensor([7, 3, 1])
    torch.testing.assert_close(module(q, q, v, lengths), dense_shared_full(q, v, lengths), rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("spec", ["clustered-7", "i-clustered-7:topk=3", "i-clustered-7:topk=7",
                                  "clustered-100", "oracle-top-7", "oracle-top-32"])
def test_as_many_clusters_or_kept_keys_as_positions_give_shared_full_exactly(spec):
    q, v = inputs(1)
    lengths = torch.tensor([7, 4, 1])
    torch.manual_seed(0)
    out = build_in_reformer_form(parse_attention_spec(spec))(q, q, v, lengths)
    torch.testing.assert_close(out, dense_shared_full(q, v, lengths), rtol=1e-12, atol=1e-12)


def test_clustered_with_fewer_clusters_is_each_clusters_softmax_without_the_own_key():
    q, v = inputs(2, length=9)
    lengths = torch.tensor([9, 6, 1])
    out, assignment = run_with_clusters(build_in_reformer_form(parse_attention_spec("clustered-3")), q, v, lengths)
    assert int(assignment.max()) == 2      # three clusters, so centroids are real means
    torch.testing.assert_close(out, dense_reformer_rows(q, v, lengths, assignment), rtol=1e-10, atol=1e-12)
    assert torch.all(out[1, :, 6:] == 0) and torch.all(out[2, :, 1:] == 0)
    torch.testing.assert_close(out[2, :, 0], v[2, :, 0])   # length 1: its own key is all there is


@pytest.mark.parametrize("topk", [1, 3])
def test_iclustered_with_fewer_clusters_is_the_paper_weights_without_the_own_key(topk):
    q, v = inputs(3, length=9)
    lengths = torch.tensor([9, 5, 2])
    module = build_in_reformer_form(parse_attention_spec(f"i-clustered-3:topk={topk}"))
    out, assignment = run_with_clusters(module, q, v, lengths, seed=4)
    expected = dense_reformer_rows(q, v, lengths, assignment, topk=topk)
    torch.testing.assert_close(out, expected, rtol=1e-10, atol=1e-12)


def test_oracle_top_keeps_the_top_k_among_the_other_keys():
    q, v = inputs(5, length=8)
    lengths = torch.tensor([8, 3, 1])
    out = build_in_reformer_form(parse_attention_spec("oracle-top-2"))(q, q, v, lengths)
    torch.testing.assert_close(out, dense_oracle_top_without_self(q, v, lengths, 2), rtol=1e-12, atol=1e-12)


def test_a_sharp_attention_stays_finite_and_exact_in_float32():
    """Long queries: the own key would take nearly all the weight; the rows are logits, so the
    other keys' weights do not cancel away."""
    q, v = inputs(6, length=6)
    q, v = (60 * q).float(), v.float()
    lengths = torch.tensor([6, 6, 2])
    torch.manual_seed(0)
    out = build_in_reformer_form(parse_attention_spec("i-clustered-6:topk=2"))(q, q, v, lengths)
    torch.testing.assert_close(out.double(), dense_shared_full(q.double(), v.double(), lengths), rtol=1e-4, atol=1e-5)


def test_differentiable_and_empty_inputs():
    q, v = inputs(7)
    q.requires_grad_(), v.requires_grad_()
    out = build_in_reformer_form(parse_attention_spec("i-clustered-2:topk=2"))(q, q, v, torch.tensor([7, 0, 3]))
    out.sum().backward()
    assert torch.isfinite(q.grad).all() and torch.isfinite(v.grad).all() and torch.all(out[1] == 0)
    empty = torch.zeros(2, 1, 0, 4)
    assert build_in_reformer_form(parse_attention_spec("clustered-2"))(empty, empty, empty).shape == (2, 1, 0, 4)


def test_which_attentions_have_the_form_and_what_they_need():
    assert [runs_in_reformer_form(name) for name in ("full", "clustered", "iclustered", "oracle_top",
                                                     "shared_full", "lsh", "linear")] == [True] * 6 + [False]
    assert type(build_in_reformer_form(parse_attention_spec("lsh-4"))).__name__ == "LSHAttention"
    with pytest.raises(AttentionConfigError, match="attention 'linear' has no Reformer key form"):
        build_in_reformer_form(parse_attention_spec("linear"))
    q, v = inputs(8)
    with pytest.raises(SharedQKRequiredError, match="clustered"):
        build_in_reformer_form(parse_attention_spec("clustered-2"))(q, q.clone(), v)

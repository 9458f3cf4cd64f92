"""oracle_top against a per-query brute force: softmax over the k best-scoring valid keys."""
import math

import pytest
import torch
import torch.nn.functional as F

from attention_ext import AttentionConfigError, build_attention


def brute_force_top(q, k, v, lengths, topk):
    batch, heads, length, dim = q.shape
    out = torch.zeros(batch, heads, length, v.shape[-1], dtype=q.dtype)
    for b in range(batch):
        valid = int(lengths[b])
        for h in range(heads):
            for i in range(valid):
                scores = [(float((q[b, h, i] @ k[b, h, j]).detach()), j) for j in range(valid)]
                kept = [j for _, j in sorted(scores, reverse=True)[:topk]]
                logits = torch.stack([q[b, h, i] @ k[b, h, j] for j in kept]) / math.sqrt(dim)
                weights = torch.softmax(logits, dim=0)
                out[b, h, i] = sum(w * v[b, h, j] for w, j in zip(weights, kept))
    return out


@pytest.mark.parametrize("topk", [1, 3, 5])
def test_matches_brute_force_with_padding_and_gradients(topk):
    torch.manual_seed(topk)
    q, k, v = (torch.randn(2, 2, 7, 4, dtype=torch.float64, requires_grad=True) for _ in range(3))
    lengths = torch.tensor([7, 4])
    out = build_attention("oracle_top", topk=topk)(q, k, v, lengths)
    expected = brute_force_top(q, k, v, lengths, topk)
    torch.testing.assert_close(out, expected)
    assert torch.all(out[1, :, 4:] == 0)
    grad = torch.randn_like(out)
    got = torch.autograd.grad(out, (q, k, v), grad)
    want = torch.autograd.grad(expected, (q, k, v), grad)
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w)


def test_topk_at_least_the_length_is_full_attention():
    torch.manual_seed(3)
    q, k, v = (torch.randn(2, 3, 40, 8) for _ in range(3))
    out = build_attention("oracle_top", topk=40)(q, k, v)
    torch.testing.assert_close(out, F.scaled_dot_product_attention(q, k, v))
    lengths = torch.tensor([40, 9])
    out = build_attention("oracle_top", topk=32)(q, k, v, lengths)  # 32 >= 9 for the second
    full = build_attention("full")(q, k, v, lengths)
    torch.testing.assert_close(out[1], full[1])


def test_works_with_shared_keys_and_keeps_self():
    torch.manual_seed(4)
    q = torch.randn(1, 1, 6, 4, dtype=torch.float64)
    v = torch.randn(1, 1, 6, 4, dtype=torch.float64)
    out = build_attention("oracle_top", topk=2)(q, q, v)
    torch.testing.assert_close(out, brute_force_top(q, q, v, torch.tensor([6]), 2))


def test_edge_lengths_and_long_sequences():
    torch.manual_seed(5)
    attention = build_attention("oracle_top", topk=32)
    q, k, v = (torch.randn(3, 1, 3000, 8, requires_grad=True) for _ in range(3))
    out = attention(q, k, v, torch.tensor([5, 3000, 0]))
    out.sum().backward()
    assert torch.isfinite(out).all() and torch.isfinite(q.grad).all() and torch.isfinite(k.grad).all()
    assert torch.all(out[2] == 0) and torch.all(out[0, :, 5:] == 0)
    one = attention(q[:1, :, :3], k[:1, :, :3], v[:1, :, :3], torch.tensor([1]))
    torch.testing.assert_close(one[0, :, 0], v[0, :, 0].detach())
    assert torch.all(one[0, :, 1:] == 0)


@pytest.mark.parametrize("options", [{"topk": 0}, {"clusters": 3}])
def test_bad_options_fail_at_build_time(options):
    with pytest.raises(AttentionConfigError, match=next(iter(options))):
        build_attention("oracle_top", **options)

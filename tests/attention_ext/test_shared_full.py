"""shared_full against dense softmax math written here: unit keys, no attention to self."""
import math

import pytest
import torch

from attention_ext import build_attention


def dense_shared_full(q, v, lengths):
    """Loops over batch, heads and queries; each query's weights over the other valid keys."""
    batch, heads, length, dim = q.shape
    out = torch.zeros(batch, heads, length, v.shape[-1], dtype=q.dtype)
    for b in range(batch):
        valid = int(lengths[b])
        for h in range(heads):
            keys = [q[b, h, j] / q[b, h, j].norm().clamp_min(1e-12) for j in range(valid)]  # zero q: zero key
            for i in range(valid):
                others = [j for j in range(valid) if j != i] or [i]  # self only when alone
                logits = torch.stack([q[b, h, i] @ keys[j] for j in others]) / math.sqrt(dim)
                weights = torch.softmax(logits, dim=0)
                out[b, h, i] = sum(w * v[b, h, j] for w, j in zip(weights, others))
    return out


def test_matches_dense_with_self_mask_padding_and_gradients():
    torch.manual_seed(0)
    q = torch.randn(3, 2, 6, 4, dtype=torch.float64, requires_grad=True)
    v = torch.randn(3, 2, 6, 3, dtype=torch.float64, requires_grad=True)
    lengths = torch.tensor([6, 3, 1])
    out = build_attention("shared_full")(q, q, v, lengths)
    expected = dense_shared_full(q, v, lengths)
    torch.testing.assert_close(out, expected)
    torch.testing.assert_close(out[2, :, 0], v[2, :, 0])  # length 1: attends to itself
    assert torch.all(out[1, :, 3:] == 0) and torch.all(out[2, :, 1:] == 0)
    grad = torch.randn_like(out)
    got = torch.autograd.grad(out, (q, v), grad)
    want = torch.autograd.grad(expected, (q, v), grad)
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w)


def test_without_lengths_and_with_an_empty_sequence():
    torch.manual_seed(1)
    q = torch.randn(2, 2, 5, 4)
    v = torch.randn(2, 2, 5, 4)
    attention = build_attention("shared_full")
    torch.testing.assert_close(attention(q, q, v), dense_shared_full(q, v, torch.tensor([5, 5])))
    out = attention(q, q, v, torch.tensor([0, 5]))
    assert torch.all(out[0] == 0) and torch.isfinite(out).all()


def test_long_and_short_sequences_in_one_batch():
    torch.manual_seed(2)
    q = torch.randn(2, 1, 2000, 8, requires_grad=True)
    v = torch.randn(2, 1, 2000, 8, requires_grad=True)
    out = build_attention("shared_full")(q, q, v, torch.tensor([5, 2000]))
    out.sum().backward()
    assert torch.isfinite(out).all() and torch.isfinite(q.grad).all()
    torch.testing.assert_close(out[0, :, :5], dense_shared_full(q[:1, :, :5].detach(), v[:1, :, :5].detach(),
                                                                torch.tensor([5]))[0])


def test_requires_shared_queries_and_keys():
    q = torch.randn(1, 1, 4, 4)
    with pytest.raises(ValueError, match="shared query/key projections"):
        build_attention("shared_full")(q, torch.randn(1, 1, 4, 4), q)


def test_float16_zero_query_gives_a_zero_key_not_nan():
    """F.normalize's eps (1e-12) is 0 in float16: a zero query would give a 0/0 key."""
    torch.manual_seed(3)
    q, v = torch.randn(1, 2, 6, 4), torch.randn(1, 2, 6, 4)
    q[0, 0, 2] = 0
    attention = build_attention("shared_full")
    q_half = q.half()
    half = attention(q_half, q_half, v.half())
    assert half.dtype == torch.float16 and torch.isfinite(half).all()
    torch.testing.assert_close(half.float(), dense_shared_full(q, v, torch.tensor([6])), atol=5e-3, rtol=5e-3)

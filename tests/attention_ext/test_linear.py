"""linear attention against a dense brute force written here: the N x N matrix of
phi(q_i) . phi(k_j) over the valid keys, row-normalised (with the fixed eps), times V."""
import pytest
import torch

from attention_ext import AttentionConfigError, available_attentions, build_attention, parse_attention_spec

from random_inputs import random_qkv

EPS = 1e-6   # attention_ext/README.md: the denominator's eps is fixed at 1e-6


def phi(x):
    return torch.where(x > 0, x + 1, torch.exp(x))   # elu(x) + 1, written out


def brute_force_linear(q, k, v, lengths):
    batch, heads, length, _ = q.shape
    out = torch.zeros(batch, heads, length, v.shape[-1], dtype=q.dtype)
    for b in range(batch):
        n = int(lengths[b])
        for h in range(heads):
            similarity = phi(q[b, h, :n]) @ phi(k[b, h, :n]).T          # (n, n), all >= 0
            out[b, h, :n] = (similarity @ v[b, h, :n]) / (similarity.sum(-1, keepdim=True) + EPS)
    return out


@pytest.mark.parametrize("lengths", [[7, 7], [7, 3], [1, 5], [0, 7]])
def test_matches_the_dense_computation_with_padding_and_gradients(lengths):
    q, k, v = random_qkv((2, 3, 7, 5), seed=sum(lengths))
    lengths = torch.tensor(lengths)
    out = build_attention("linear")(q, k, v, lengths)
    expected = brute_force_linear(q, k, v, lengths)
    torch.testing.assert_close(out, expected)
    for b, n in enumerate(lengths.tolist()):
        assert torch.all(out[b, :, n:] == 0)
    grad = torch.randn_like(out)
    got = torch.autograd.grad(out, (q, k, v), grad)
    want = torch.autograd.grad(expected, (q, k, v), grad, allow_unused=True, materialize_grads=True)
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w)


def test_value_dim_may_differ_and_float32_matches_float64():
    q, k = random_qkv((2, 2, 9, 4), seed=1)[:2]
    v = torch.randn(2, 2, 9, 6, dtype=torch.float64)
    lengths = torch.tensor([9, 4])
    out = build_attention("linear")(q.float(), k.float(), v.float(), lengths)
    assert out.dtype == torch.float32 and out.shape == (2, 2, 9, 6)
    torch.testing.assert_close(out.double(), brute_force_linear(q, k, v, lengths), rtol=1e-5, atol=1e-5)


def test_gradcheck():
    q, k, v = random_qkv((2, 2, 5, 3), seed=2)
    lengths = torch.tensor([5, 2])
    assert torch.autograd.gradcheck(lambda q, k, v: build_attention("linear")(q, k, v, lengths), (q, k, v))


def test_padding_content_and_amount_do_not_matter():
    q, k, v = random_qkv((1, 2, 6, 4), seed=3)
    attention = build_attention("linear")
    alone = attention(q, k, v)
    padded = [torch.cat([x, 1e3 * torch.randn(1, 2, 5, 4, dtype=x.dtype)], dim=2) for x in (q, k, v)]
    padded[1][0, 0, 8, 0] = float("nan")     # a NaN in a padded key changes nothing
    out = attention(*padded, torch.tensor([6]))
    torch.testing.assert_close(out[:, :, :6], alone)
    assert torch.all(out[:, :, 6:] == 0)


def test_one_valid_key_gives_its_value_and_no_valid_key_gives_zeros():
    q, k, v = random_qkv((3, 2, 4, 3), seed=4)
    out = build_attention("linear")(q, k, v, torch.tensor([1, 0, 1]))
    # phi(q) . phi(k) / (phi(q) . phi(k) + eps): within eps of 1 for a single key
    torch.testing.assert_close(out[[0, 2], :, 0], v[[0, 2], :, 0].detach(), rtol=1e-5, atol=1e-5)
    assert torch.all(out[1] == 0) and torch.all(out[:, :, 1:] == 0)
    out.sum().backward()
    assert torch.isfinite(q.grad).all() and torch.all(q.grad[1] == 0)


def test_empty_batch_and_empty_sequences_keep_the_graph():
    for shape in ((0, 2, 4, 3), (2, 2, 0, 3)):
        q, k, v = random_qkv(shape, seed=5)
        out = build_attention("linear")(q, k, v)
        assert out.shape == shape
        out.sum().backward()
        assert q.grad is not None and v.grad is not None


def test_spec_and_registry_facts():
    assert parse_attention_spec("Linear") == ("linear", {})
    assert not available_attentions()["linear"].needs_shared_qk
    with pytest.raises(AttentionConfigError, match="'linear' takes no number"):
        parse_attention_spec("linear-4")

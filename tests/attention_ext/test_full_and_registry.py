"""The registry's option validation and the full (SDPA) attention against dense softmax math."""
import math

import pytest
import torch

from attention_ext import (AttentionConfigError, SharedQKRequiredError, available_attentions, build_attention,
                           validate_attention)
from attention_ext.contract import check_inputs


def dense_attention(q, k, v, lengths):
    """softmax(q k^T / sqrt(E)) v over the first `length` keys; rows past `length` are 0."""
    out = torch.zeros_like(q)
    for b, length in enumerate(lengths.tolist()):
        if length == 0:
            continue
        scores = q[b, :, :length] @ k[b, :, :length].transpose(-1, -2) / math.sqrt(q.shape[-1])
        out[b, :, :length] = torch.softmax(scores, dim=-1) @ v[b, :, :length]
    return out


def test_full_matches_dense_softmax_with_padding_and_gradients():
    torch.manual_seed(0)
    q, k, v = (torch.randn(3, 2, 9, 4, dtype=torch.float64, requires_grad=True) for _ in range(3))
    lengths = torch.tensor([9, 4, 1])
    out = build_attention("full")(q, k, v, lengths)
    expected = dense_attention(q, k, v, lengths)
    torch.testing.assert_close(out, expected)
    grad = torch.randn_like(out)
    got = torch.autograd.grad(out, (q, k, v), grad)
    want = torch.autograd.grad(expected, (q, k, v), grad)
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w)


def test_full_without_lengths_and_with_empty_sequence():
    torch.manual_seed(1)
    q, k, v = (torch.randn(2, 1, 5, 3) for _ in range(3))
    full = build_attention("full")
    torch.testing.assert_close(full(q, k, v), dense_attention(q, k, v, torch.tensor([5, 5])))
    out = full(q, k, v, torch.tensor([0, 5]))
    assert torch.all(out[0] == 0) and torch.isfinite(out).all()


def test_unknown_name_lists_the_allowed_names():
    with pytest.raises(AttentionConfigError, match="(?s)unknown attention 'fullish'.*full"):
        build_attention("fullish")


def test_unknown_option_and_bad_values_are_refused():
    with pytest.raises(AttentionConfigError, match="has no option clusters"):
        build_attention("full", clusters=3)


@pytest.mark.parametrize("name,option,value", [
    ("clustered", "bits", 0), ("clustered", "bits", 64), ("clustered", "clusters", 0),
    ("iclustered", "topk", 0), ("lsh", "rounds", 0), ("lsh", "chunk_size", 0), ("lsh", "max_buckets", 3),
    ("oracle_top", "topk", 0), ("clustered", "clusters", "many"), ("clustered", "clusters", 2.5),
])
def test_option_range_errors_name_option_and_rule(name, option, value):
    from attention_ext import available_attentions
    if name not in available_attentions():
        pytest.skip(f"{name} is not registered")
    with pytest.raises(AttentionConfigError, match=option):
        build_attention(name, **{option: value})


def test_defaults_are_filled_in():
    from attention_ext import available_attentions
    if "iclustered" not in available_attentions():
        pytest.skip("iclustered is not registered")
    assert validate_attention("iclustered") == (
        "iclustered", {"clusters": 100, "bits": 63, "iterations": 10, "topk": 32})


def test_contract_rejects_bad_shapes_and_lengths():
    q = torch.randn(2, 1, 5, 3)
    with pytest.raises(ValueError, match="lengths must lie in"):
        check_inputs(q, q, q, torch.tensor([6, 1]))
    with pytest.raises(ValueError, match="shape"):
        check_inputs(q[0], q[0], q[0], None)
    with pytest.raises(ValueError, match="lengths must have shape"):
        check_inputs(q, q, q, torch.tensor([5]))


@pytest.mark.parametrize("name", sorted(available_attentions()))
def test_every_attention_refuses_inputs_on_two_devices(name):
    """A kernel handed a tensor of another device would read a foreign pointer: refused first
    (the meta device stands in for a second device on a machine with only a CPU)."""
    q = torch.randn(1, 1, 4, 2)
    with pytest.raises(ValueError, match=r"q, k, v must be on one device, got cpu, cpu, meta"):
        build_attention(name)(q, q, q.to("meta"))


@pytest.mark.parametrize("name", sorted(name for name, entry in available_attentions().items()
                                        if entry.needs_shared_qk))
def test_shared_qk_attentions_refuse_a_separate_key_tensor(name):
    q, k = torch.randn(1, 1, 4, 2), torch.randn(1, 1, 4, 2)
    with pytest.raises(SharedQKRequiredError, match=f"attention '{name}' needs a model with shared query/key"):
        build_attention(name)(q, k, q)
    assert validate_attention(name).needs_shared_qk

"""Reformer LSH attention against a dense computation built here from the same rotations.

The test re-derives everything but the random rotations: the buckets (argmax of
[xR, -xR] over the unit keys), the sort by (bucket, position), the chunks, each query's
window (own chunk + previous chunk, cyclic, self excluded unless alone), and the
multi-round combination, then compares with dense masked softmax attention.
"""
import math

import pytest
import torch

from attention_ext import AttentionConfigError, build_attention, parse_attention_spec
from attention_ext._ops import ops
from attention_ext.contract import draw_seed
from attention_ext.attentions.lsh import (device_rotations, lsh_bucket_count, lsh_chunked_attention, lsh_hash,
                                lsh_hash_on_device, lsh_rotations)


def reference_buckets(q, length, rotation):
    """Buckets of the first `length` unit keys of one (batch, head) under rotation (E, P)."""
    unit = q[:length] / q[:length].norm(dim=-1, keepdim=True)
    projected = unit @ rotation.to(q.dtype)
    return torch.cat([projected, -projected], dim=-1).argmax(dim=-1)


def reference_windows(buckets, chunk_size):
    """(L, L) bool: key j lies in the window of query i for this round (self excluded unless alone)."""
    length = len(buckets)
    order = sorted(range(length), key=lambda position: (int(buckets[position]), position))
    chunks = [order[start:start + chunk_size] for start in range(0, length, chunk_size)]
    allowed = torch.zeros(length, length, dtype=torch.bool)
    for index, members in enumerate(chunks):
        keys = set(members)
        if len(chunks) > 1:
            keys |= set(chunks[index - 1])  # index - 1 = -1 wraps to the last chunk
        for query in members:
            allowed[query, sorted(keys)] = True
    if length > 1:
        allowed.fill_diagonal_(False)
    return allowed


def reference_bucket_count(length, chunk_size, max_buckets=256):
    """The module doc's rule, written out: the smallest even count >= length / chunk_size, at
    least 2, at most max_buckets."""
    natural = 2
    while natural * chunk_size < length:
        natural += 2
    return min(natural, max_buckets)


def reference_lsh(q, v, lengths, rounds, chunk_size, seed, rotations_of=None, max_buckets=256):
    """Dense LSH attention: per round the allowed-key masks, combined by log-sum-exp with
    each key's logit lowered by log(number of rounds holding it), as the module doc says.
    The rotations of element b: lsh_rotations(seed, b, ...), or rotations_of(b, n_buckets) if given.
    Returns (output, per-(b, h) list of per-round masks)."""
    batch, heads, length, dim = q.shape
    out = torch.zeros(batch, heads, length, v.shape[-1], dtype=q.dtype)
    masks = {}
    for b, valid in enumerate(lengths.tolist()):
        if valid == 0:
            continue
        n_buckets = reference_bucket_count(valid, chunk_size, max_buckets)
        rotations = (lsh_rotations(seed, b, heads, rounds, dim, n_buckets) if rotations_of is None
                     else rotations_of(b, n_buckets))
        for h in range(heads):
            round_masks = [reference_windows(reference_buckets(q[b, h], valid, rotations[h, r]),
                                             chunk_size) for r in range(rounds)]
            masks[b, h] = round_masks
            counts = torch.stack(round_masks).sum(0)
            unit = q[b, h, :valid] / q[b, h, :valid].norm(dim=-1, keepdim=True)
            scores = q[b, h, :valid] @ unit.T / math.sqrt(dim)
            round_out, round_lse = [], []
            for mask in round_masks:
                logits = (scores - counts.clamp(min=1).to(q.dtype).log()).masked_fill(~mask, -math.inf)
                round_lse.append(torch.logsumexp(logits, dim=-1))
                round_out.append(torch.softmax(logits, dim=-1) @ v[b, h, :valid])
            weights = torch.softmax(torch.stack(round_lse), dim=0)  # exp(lse_r - logsumexp lse)
            out[b, h, :valid] = (weights[..., None] * torch.stack(round_out)).sum(0)
    return out, masks


def union_attention(q, v, lengths, masks):
    """Softmax over the union of the rounds' windows, each key once."""
    out = torch.zeros(q.shape[:3] + v.shape[3:], dtype=q.dtype)
    for (b, h), round_masks in masks.items():
        valid = int(lengths[b])
        union = torch.stack(round_masks).any(0)
        unit = q[b, h, :valid] / q[b, h, :valid].norm(dim=-1, keepdim=True)
        scores = (q[b, h, :valid] @ unit.T / math.sqrt(q.shape[-1])).masked_fill(~union, -math.inf)
        out[b, h, :valid] = torch.softmax(scores, dim=-1) @ v[b, h, :valid]
    return out


def shared_full_reference(q, v, lengths):
    out = torch.zeros(q.shape[:3] + v.shape[3:], dtype=q.dtype)
    for b, valid in enumerate(lengths.tolist()):
        if valid == 0:
            continue
        unit = q[b, :, :valid] / q[b, :, :valid].norm(dim=-1, keepdim=True)
        scores = q[b, :, :valid] @ unit.transpose(-1, -2) / math.sqrt(q.shape[-1])
        if valid > 1:
            scores = scores.masked_fill(torch.eye(valid, dtype=torch.bool), -math.inf)
        out[b, :, :valid] = torch.softmax(scores, dim=-1) @ v[b, :, :valid]
    return out


@pytest.mark.parametrize("rounds,chunk_size,length,max_buckets", [
    (1, 4, 23, 256), (3, 4, 23, 256), (2, 3, 9, 256), (4, 5, 30, 256), (2, 8, 16, 256), (1, 1, 6, 256),
    # capped below the uncapped rule's count (22, 18 and 2 buckets for chunks of 2): buckets of several chunks
    (2, 2, 41, 4), (1, 3, 41, 2), (3, 1, 41, 6)])
def test_lsh_matches_dense_reference_from_the_same_rotations(rounds, chunk_size, length, max_buckets, device):
    torch.manual_seed(rounds * 100 + chunk_size)
    q = torch.randn(3, 2, length, 6, dtype=torch.float64, requires_grad=True)
    v = torch.randn(3, 2, length, 5, dtype=torch.float64, requires_grad=True)
    lengths = torch.tensor([length, length - 5, 2])
    attention = build_attention("lsh", rounds=rounds, chunk_size=chunk_size, max_buckets=max_buckets)
    # the attention runs on `device`; the reference is computed here, on the CPU
    qd, vd, lengths_d = q.detach().to(device).requires_grad_(), v.detach().to(device).requires_grad_(), \
        lengths.to(device)

    torch.manual_seed(7)
    seed = draw_seed()
    hashing = attention.hash(qd, lengths_d, seed=seed)
    hashing.buckets = hashing.buckets.cpu()
    for b, valid in enumerate(lengths.tolist()):
        n_buckets = reference_bucket_count(valid, chunk_size, max_buckets)
        assert hashing.n_buckets[b] == n_buckets
        assert hashing.rotations[b].shape == (2, rounds, 6, n_buckets // 2)
        for h in range(2):
            for r in range(rounds):
                expected = reference_buckets(q[b, h].detach(), valid, hashing.rotations[b][h, r])
                assert torch.equal(hashing.buckets[b, h, r, :valid], expected)
                assert torch.all(hashing.buckets[b, h, r, valid:] == -1)
                assert 0 <= hashing.buckets[b, h, r, :valid].min() and hashing.buckets[b, h, r].max() < n_buckets

    rotations_of = None
    if device.type == "cuda":   # a forward call there draws its rotations on the device
        torch.manual_seed(7)
        drawn = device_rotations(qd, rounds, chunk_size, max_buckets).cpu()
        rotations_of = lambda b, n_buckets: drawn[b, :, :, :, :n_buckets // 2].permute(0, 2, 1, 3)  # noqa: E731
    torch.manual_seed(7)  # the call draws the same seed (on CUDA: the same rotations)
    out = attention(qd, qd, vd, lengths_d)
    expected, masks = reference_lsh(q, v, lengths, rounds, chunk_size, seed, rotations_of, max_buckets)
    torch.testing.assert_close(out.cpu(), expected)
    # The log-sum-exp combination with duplicates removed is softmax over the union.
    torch.testing.assert_close(expected, union_attention(q, v, lengths, masks))
    assert torch.all(out[1, :, length - 5:] == 0) and torch.all(out[2, :, 2:] == 0)

    grad = torch.randn_like(expected)
    got = torch.autograd.grad(out, (qd, vd), grad.to(device))
    want = torch.autograd.grad(expected, (q, v), grad)
    for g, w in zip(got, want):
        torch.testing.assert_close(g.cpu(), w)


def test_lsh_float32_matches_reference():
    torch.manual_seed(3)
    q = torch.randn(2, 2, 160, 16)
    v = torch.randn(2, 2, 160, 16)
    lengths = torch.tensor([160, 77])
    torch.manual_seed(11)
    seed = draw_seed()
    torch.manual_seed(11)
    out = build_attention("lsh", rounds=2, chunk_size=16)(q, q, v, lengths)
    expected, _ = reference_lsh(q.double(), v.double(), lengths, 2, 16, seed)
    torch.testing.assert_close(out, expected.float(), rtol=1e-4, atol=1e-5)


def test_float32_weights_that_underflow_are_zero_as_in_exact_math():
    """The float32 kernels' exp (common/vector_exp.h) gives 0 where a weight is more than ~87.3
    below its row's largest, as exact math rounded to float32 does (e^-400 is 0 in float32); the
    copy lsh.cpp had before clamped there and gave ~1.6e-38. Seen in a gradient: key 5 points
    away from every other query, whose logits with it lie ~400 below their others, so it gets
    weight only from itself, which is masked: its value gradient is exactly 0 (it was ~1e-37)."""
    q = torch.tensor([[300.0, 0.0], [300.0, 1.0], [300.0, -1.0], [300.0, 2.0], [300.0, -2.0], [-1.0, 0.0]])
    q = q[None, None].requires_grad_()
    v = torch.randn(1, 1, 6, 3, generator=torch.Generator().manual_seed(0)).requires_grad_()
    lengths = torch.tensor([6])
    out = build_attention("lsh", rounds=1, chunk_size=8)(q, q, v, lengths)   # one chunk: shared-full
    q64, v64 = (t.detach().double().requires_grad_() for t in (q, v))
    expected = shared_full_reference(q64, v64, lengths)
    grad = torch.randn(out.shape, generator=torch.Generator().manual_seed(1))
    got = torch.autograd.grad(out, (q, v), grad)
    want = torch.autograd.grad(expected, (q64, v64), grad.double())
    # logits of ~212 carry float32 rounding of ~2e-5 into the weights
    torch.testing.assert_close(out, expected.float(), rtol=1e-4, atol=1e-4)
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w.float(), rtol=1e-4, atol=1e-4)
    assert want[1][0, 0, 5].float().abs().max() == 0   # exact math, rounded to float32
    assert torch.all(got[1][0, 0, 5] == 0)


@pytest.mark.parametrize("rounds", [1, 3])
def test_single_chunk_equals_shared_full(rounds):
    torch.manual_seed(5)
    q = torch.randn(3, 2, 12, 4, dtype=torch.float64)
    v = torch.randn(3, 2, 12, 4, dtype=torch.float64)
    lengths = torch.tensor([12, 7, 1])
    out = build_attention("lsh", rounds=rounds, chunk_size=12)(q, q, v, lengths)
    torch.testing.assert_close(out, shared_full_reference(q, v, lengths))
    torch.testing.assert_close(out, build_attention("shared_full")(q, q, v, lengths))


def test_chunked_attention_gradcheck_with_arbitrary_orders(device):
    """gradcheck of the custom autograd function (float64), several chunks and rounds."""
    torch.manual_seed(0)
    batch, heads, length, rounds = 2, 2, 7, 2
    q = torch.randn(batch, heads, length, 3, dtype=torch.float64, requires_grad=True)
    v = torch.randn(batch, heads, length, 2, dtype=torch.float64, requires_grad=True)
    lengths = torch.tensor([7, 5])
    order = torch.empty(batch, heads, rounds, length, dtype=torch.long)
    for b, valid in enumerate(lengths.tolist()):
        for h in range(heads):
            for r in range(rounds):
                order[b, h, r] = torch.cat([torch.randperm(valid), torch.arange(valid, length)])
    q, v = (t.detach().to(device).requires_grad_() for t in (q, v))
    order, lengths = order.to(device), lengths.to(device)
    for chunk_size in (2, 3):
        assert torch.autograd.gradcheck(
            lambda q, v: lsh_chunked_attention(q, v, order, lengths, chunk_size), (q, v))


def test_module_gradcheck_with_a_fixed_seed():
    torch.manual_seed(1)
    q = torch.randn(2, 1, 9, 3, dtype=torch.float64, requires_grad=True)
    v = torch.randn(2, 1, 9, 3, dtype=torch.float64, requires_grad=True)
    lengths = torch.tensor([9, 6])
    attention = build_attention("lsh", rounds=2, chunk_size=2)

    def call(q, v):
        torch.manual_seed(4)
        return attention(q, q, v, lengths)
    assert torch.autograd.gradcheck(call, (q, v))


def test_padding_invariance_and_seeded_repeatability():
    torch.manual_seed(2)
    q = torch.randn(2, 2, 40, 8)
    v = torch.randn(2, 2, 40, 8)
    attention = build_attention("lsh", rounds=2, chunk_size=4)
    torch.manual_seed(9)
    alone = attention(q[:1, :, :25], q[:1, :, :25], v[:1, :, :25])
    torch.manual_seed(9)
    batched = attention(q, q, v, torch.tensor([25, 40]))
    torch.testing.assert_close(batched[:1, :, :25], alone)
    assert torch.all(batched[0, :, 25:] == 0)

    torch.manual_seed(9)
    again = attention(q, q, v, torch.tensor([25, 40]))
    assert torch.equal(again, batched)
    torch.manual_seed(10)
    other = attention.hash(q, torch.tensor([25, 40]))
    torch.manual_seed(9)
    first = attention.hash(q, torch.tensor([25, 40]))
    assert not torch.equal(other.buckets, first.buckets)


def test_edge_lengths_give_finite_outputs_and_gradients():
    torch.manual_seed(6)
    attention = build_attention("lsh", rounds=2, chunk_size=32)
    # a batch mixing 5 and 5000 frames, a length-1 sequence and an empty one
    q = torch.randn(4, 1, 5000, 8, requires_grad=True)
    v = torch.randn(4, 1, 5000, 8, requires_grad=True)
    lengths = torch.tensor([5, 5000, 1, 0])
    out = attention(q, q, v, lengths)
    out.sum().backward()
    assert torch.isfinite(out).all() and torch.isfinite(q.grad).all() and torch.isfinite(v.grad).all()
    torch.testing.assert_close(out[2, :, 0], v[2, :, 0].detach())  # alone: attends to itself
    assert torch.all(out[3] == 0) and torch.all(out[0, :, 5:] == 0)
    torch.testing.assert_close(out[0], shared_full_reference(q[:1].detach(), v[:1].detach(),
                                                             torch.tensor([5]))[0])
    # all but one position padded
    short = attention(q[:1, :, :4], q[:1, :, :4], v[:1, :, :4], torch.tensor([1]))
    torch.testing.assert_close(short[0, :, 0], v[0, :, 0].detach())
    assert torch.all(short[0, :, 1:] == 0)
    # lengths=None
    assert torch.isfinite(attention(q[:1, :, :50], q[:1, :, :50], v[:1, :, :50])).all()
    # half precision runs through the float32 kernels
    half = q[:1, :, :64].detach().to(torch.bfloat16)
    torch.manual_seed(3)
    out_half = attention(half, half, v[:1, :, :64].detach().to(torch.bfloat16))
    torch.manual_seed(3)
    single = half.float()
    out_single = attention(single, single, v[:1, :, :64].detach().to(torch.bfloat16).float())
    assert out_half.dtype == torch.bfloat16
    torch.testing.assert_close(out_half.float(), out_single, rtol=2e-2, atol=2e-2)


def test_lsh_requires_shared_queries_and_keys():
    q = torch.randn(1, 1, 5, 4)
    with pytest.raises(ValueError, match="shared query/key projections"):
        build_attention("lsh")(q, q.clone(), q)


@pytest.mark.parametrize("options", [{"rounds": 0}, {"chunk_size": 0}, {"buckets": 4}])
def test_bad_options_fail_at_build_time(options):
    with pytest.raises(AttentionConfigError, match=next(iter(options))):
        build_attention("lsh", **options)


@pytest.mark.parametrize("value,message", [
    (0, r"max_buckets=0 is out of range; allowed: max_buckets: int >= 2, a multiple of 2 \(default 256\)"),
    (1, r"max_buckets=1 is out of range"),
    (7, r"option max_buckets=7 is not a multiple of 2; allowed: max_buckets: int >= 2, a multiple of 2"),
    ("many", r"max_buckets='many' must be an integer")])
def test_max_buckets_must_be_even_and_at_least_two(value, message):
    with pytest.raises(AttentionConfigError, match=message):
        build_attention("lsh", max_buckets=value)
    with pytest.raises(AttentionConfigError, match="max_buckets=5 is not a multiple of 2"):
        parse_attention_spec("lsh-4:max_buckets=5")
    assert parse_attention_spec("lsh-4:max_buckets=2").options == {"rounds": 4, "chunk_size": 32, "max_buckets": 2}
    # the functions below the registry check it too
    with pytest.raises(ValueError, match="max_buckets=3 must be an even integer >= 2"):
        lsh_hash(torch.randn(1, 1, 4, 2), torch.tensor([4]), 1, 2, seed=0, max_buckets=3)
    with pytest.raises(ValueError, match="max_buckets=0 must be an even integer >= 2"):
        device_rotations(torch.randn(1, 1, 4, 2), 1, 2, max_buckets=0)


def test_bucket_count_follows_the_sequence_length():
    assert lsh_bucket_count(1, 32) == 2
    assert lsh_bucket_count(64, 32) == 2
    assert lsh_bucket_count(65, 32) == 4
    assert lsh_bucket_count(4096, 32) == 128
    assert lsh_bucket_count(4096, 32, max_buckets=256) == 128
    assert lsh_bucket_count(4096, 32, max_buckets=16) == 16
    assert lsh_bucket_count(262144, 32, max_buckets=256) == 256
    assert lsh_bucket_count(262144, 32) == 8192
    for length in (1, 65, 500, 8192, 8193, 20000):
        for chunk_size, cap in ((32, 256), (4, 10), (1, 2)):
            assert lsh_bucket_count(length, chunk_size, cap) == reference_bucket_count(length, chunk_size, cap)


def test_the_default_cap_changes_nothing_up_to_256_chunks():
    """max_buckets=256 (the default) is the uncapped rule for every length up to 256 x chunk_size
    (8,192 with chunks of 32, more than any model of the project has seen), and caps beyond."""
    for chunk_size in (1, 4, 32, 64):
        for length in range(0, 256 * chunk_size + 1):
            assert lsh_bucket_count(length, chunk_size, 256) == lsh_bucket_count(length, chunk_size)
        assert lsh_bucket_count(256 * chunk_size + 1, chunk_size) == 258
        assert lsh_bucket_count(256 * chunk_size + 1, chunk_size, 256) == 256


def test_the_default_cap_gives_bit_identical_results_at_8192_positions(device):
    """The default module against one with a cap no sequence reaches (the uncapped rule): the same
    rotations, buckets, order and output, to the bit, at exactly 256 chunks of 32 (and shorter)."""
    generator = torch.Generator().manual_seed(31)
    q = torch.randn(2, 1, 8192, 8, generator=generator).to(device)
    v = torch.randn(2, 1, 8192, 8, generator=generator).to(device)
    lengths = torch.tensor([8192, 3000], device=device)
    default, uncapped = build_attention("lsh", rounds=2), build_attention("lsh", rounds=2, max_buckets=10**6)
    hashing, uncapped_hashing = default.hash(q, lengths, seed=4), uncapped.hash(q, lengths, seed=4)
    assert hashing.n_buckets == uncapped_hashing.n_buckets == [256, 94]
    assert torch.equal(hashing.buckets, uncapped_hashing.buckets)
    assert torch.equal(hashing.order, uncapped_hashing.order)
    outs = []
    for attention in (default, uncapped):
        torch.manual_seed(5)
        outs.append(attention(q, q, v, lengths))
    assert torch.equal(*outs)
    # one position more and the default caps: 256 buckets where the uncapped rule has 258
    longer = torch.randn(1, 1, 8193, 8, generator=generator)
    assert default.hash(longer, seed=4).n_buckets == [256]
    assert uncapped.hash(longer, seed=4).n_buckets == [258]


def test_buckets_and_order_of_long_sequences(device):
    """Many buckets (the kernel's vectorised argmax and its tail) and the counting sort."""
    torch.manual_seed(8)
    q = torch.randn(2, 2, 700, 8, dtype=torch.float64)
    lengths = torch.tensor([700, 333])
    attention = build_attention("lsh", rounds=2, chunk_size=8)
    hashing = attention.hash(q.to(device), lengths.to(device), seed=123)
    hashing.buckets, hashing.order = hashing.buckets.cpu(), hashing.order.cpu()
    assert hashing.n_buckets == [88, 42]
    for b, valid in enumerate(lengths.tolist()):
        for h in range(2):
            for r in range(2):
                buckets = reference_buckets(q[b, h], valid, hashing.rotations[b][h, r])
                assert torch.equal(hashing.buckets[b, h, r, :valid], buckets)
                order = sorted(range(valid), key=lambda position: (int(buckets[position]), position))
                assert hashing.order[b, h, r, :valid].tolist() == order
                assert hashing.order[b, h, r, valid:].tolist() == list(range(valid, 700))
    # float32 hashing agrees except, at most, on rare near-ties
    single = attention.hash(q.float().to(device), lengths.to(device), seed=123)
    assert (single.buckets.cpu() == hashing.buckets).float().mean() > 0.99


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_hash_kernel_breaks_ties_as_torch_argmax(dtype, device):
    """Small integers in q and the rotations: the projections are exact, with many ties,
    which must go to the first index of [xR, -xR] as in torch.argmax. The columns past
    half_buckets hold large values that the kernel must ignore."""
    generator = torch.Generator().manual_seed(21)
    batch, heads, rounds, length, dim, width = 3, 2, 2, 300, 5, 32
    halves, lengths = [1, 21, 32], torch.tensor([300, 257, 45])  # one column; a vector and a tail
    q = torch.randint(-2, 3, (batch, heads, length, dim), generator=generator).to(dtype)
    q[0, 0, 3] = 0  # every projection 0: bucket 0
    rotations = torch.full((batch, heads, dim, rounds, width), 9, dtype=dtype)
    for b, half in enumerate(halves):
        rotations[b, ..., :half] = torch.randint(-1, 2, (heads, dim, rounds, half), generator=generator)
    buckets, order = ops.lsh_hash(q.to(device), rotations.to(device), lengths.to(device),
                                  torch.tensor(halves, device=device))
    buckets, order = buckets.cpu(), order.cpu()
    ties = 0
    for b, (valid, half) in enumerate(zip(lengths.tolist(), halves)):
        for h in range(heads):
            for r in range(rounds):
                projected = q[b, h, :valid] @ rotations[b, h, :, r, :half]
                candidates = torch.cat([projected, -projected], dim=-1)
                ties += int(((candidates == candidates.max(-1, keepdim=True).values).sum(-1) > 1).sum())
                expected = candidates.argmax(dim=-1)
                assert torch.equal(buckets[b, h, r, :valid], expected)
                assert order[b, h, r, :valid].tolist() == sorted(
                    range(valid), key=lambda position: (int(expected[position]), position))
    assert ties > 500  # the test does exercise ties


@pytest.mark.parametrize("max_buckets,width", [
    (256, 32),   # n_buckets(200) = 50: 25 columns, 2 tiles of 16
    (10, 16),    # capped: 5 columns, 1 tile; the sequence of 77 has 10 buckets too, not 20
    (2, 16)])
def test_device_hashing_takes_each_sequences_buckets_from_rotations_of_the_padded_width(
        max_buckets, width, device):
    """lsh_hash_on_device, the CUDA forward's hashing (nothing read on the host): rotations of the
    padded length's width, drawn from the generator of q's device, of which sequence b uses its
    first lsh_bucket_count(L_b, chunk_size, max_buckets) / 2 columns; the order lists its valid
    positions by (bucket, position), then the padded ones. Also run on the CPU, where the same
    Python path is tested."""
    torch.manual_seed(3)
    q = torch.randn(3, 2, 200, 6, dtype=torch.float64)
    lengths = torch.tensor([200, 77, 0])
    rounds, chunk_size = 2, 4
    torch.manual_seed(9)
    rotations = device_rotations(q.to(device), rounds, chunk_size, max_buckets).cpu()
    assert rotations.shape == (3, 2, 6, rounds, width)
    torch.manual_seed(9)
    order = lsh_hash_on_device(q.to(device), lengths.to(device), rounds, chunk_size, max_buckets).cpu()
    for b, valid in enumerate(lengths.tolist()):
        half = reference_bucket_count(valid, chunk_size, max_buckets) // 2
        for h in range(2):
            for r in range(rounds):
                buckets = reference_buckets(q[b, h], valid, rotations[b, h, :, r, :half])
                expected = sorted(range(valid), key=lambda position: (int(buckets[position]), position))
                assert order[b, h, r, :valid].tolist() == expected
                assert order[b, h, r, valid:].tolist() == list(range(valid, 200))


def test_the_rotations_stay_within_max_buckets_at_any_length():
    """The hashing's width (its multiply-adds per position) stops growing at max_buckets / 2
    columns: a quarter of a million positions hash on 128 columns (8,192 uncapped)."""
    queries = torch.empty(1, 1, 262144, 2)
    assert device_rotations(queries, 1, 32).shape[-1] == 128
    assert device_rotations(queries, 1, 32, max_buckets=64).shape[-1] == 32
    assert device_rotations(queries, 1, 32, max_buckets=2**20).shape[-1] == 4096


def test_kernel_rejects_an_order_that_is_not_a_permutation(device):
    q = torch.randn(1, 1, 4, 3, device=device)
    order = torch.tensor([0, 1, 1, 3], device=device).view(1, 1, 1, 4)  # position 1 twice, 2 missing
    with pytest.raises(RuntimeError, match="permutation of the valid positions"):
        lsh_chunked_attention(q, q, order, torch.tensor([4], device=device), 2)


def test_many_chunks_in_parallel_match_the_reference():
    """Enough chunks for several parallel tasks per sequence (and their boundary rows)."""
    torch.manual_seed(12)
    q = torch.randn(2, 2, 600, 8, dtype=torch.float64, requires_grad=True)
    v = torch.randn(2, 2, 600, 8, dtype=torch.float64, requires_grad=True)
    lengths = torch.tensor([600, 333])
    torch.manual_seed(13)
    seed = draw_seed()
    torch.manual_seed(13)
    out = build_attention("lsh", rounds=2, chunk_size=8)(q, q, v, lengths)
    expected, _ = reference_lsh(q, v, lengths, 2, 8, seed)
    torch.testing.assert_close(out, expected)
    grad = torch.randn_like(out)
    for g, w in zip(torch.autograd.grad(out, (q, v), grad), torch.autograd.grad(expected, (q, v), grad)):
        torch.testing.assert_close(g, w)


def windows_of_order(order, chunk_size):
    """(L, L) bool windows of one round given its sorted order (a permutation of 0..L-1):
    own chunk and previous chunk (cyclic, when there are several), self excluded unless alone."""
    length = len(order)
    chunk = torch.empty(length, dtype=torch.long)
    chunk[order] = torch.arange(length) // chunk_size
    chunks = -(-length // chunk_size)
    allowed = chunk[:, None] == chunk[None, :]
    if chunks > 1:
        allowed |= chunk[None, :] == (chunk[:, None] - 1) % chunks
    if length > 1:
        allowed.fill_diagonal_(False)
    return allowed


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("rounds,chunk_size,lengths", [
    (1, 11, [200, 23, 13]),   # 19 chunks: several groups of consecutive chunks, a short last chunk
    (2, 13, [200, 26, 14]),   # windows of 14..26 keys: every row tail of the register tiles
    (1, 40, [330, 80, 41]),   # windows wider than a 32-column tile: column tails too
    (3, 5, [171, 10, 6]),     # 35 chunks; two chunks (each the other's previous); 5 + 1
])
def test_chunked_kernel_matches_brute_force_for_any_order(rounds, chunk_size, lengths, dtype):
    """The chunked attention kernel (forward and gradients) against dense softmax over the
    windows that random sorted orders define: many chunks per sequence, so a window's
    previous-chunk keys come from the chunk computed just before it as well as from a fresh
    gather, window sizes that are not multiples of the kernel's register tiles, two chunks."""
    generator = torch.Generator().manual_seed(rounds * 1000 + chunk_size)
    batch, heads, length, dim, value_dim = len(lengths), 2, max(lengths), 20, 36
    q = torch.randn(batch, heads, length, dim, generator=generator, dtype=torch.float64)
    v = torch.randn(batch, heads, length, value_dim, generator=generator, dtype=torch.float64)
    order = torch.empty(batch, heads, rounds, length, dtype=torch.long)
    for b, valid in enumerate(lengths):
        for h in range(heads):
            for r in range(rounds):
                order[b, h, r] = torch.cat([torch.randperm(valid, generator=generator),
                                            torch.arange(valid, length)])
    lengths_t = torch.tensor(lengths)
    qk, vk = q.to(dtype).requires_grad_(), v.to(dtype).requires_grad_()
    out = lsh_chunked_attention(qk, vk, order, lengths_t, chunk_size)
    grad = torch.randn(out.shape, generator=generator, dtype=torch.float64)
    got = torch.autograd.grad(out, (qk, vk), grad.to(dtype))

    qr, vr = q.clone().requires_grad_(), v.clone().requires_grad_()
    expected = torch.zeros_like(out, dtype=torch.float64)
    for b, valid in enumerate(lengths):
        for h in range(heads):
            masks = torch.stack([windows_of_order(order[b, h, r, :valid], chunk_size)
                                 for r in range(rounds)])
            union = masks.any(0)  # exact softmax over the union of the rounds' windows
            unit = qr[b, h, :valid] / qr[b, h, :valid].norm(dim=-1, keepdim=True)
            scores = (qr[b, h, :valid] @ unit.T / math.sqrt(dim)).masked_fill(~union, -math.inf)
            expected[b, h, :valid] = torch.softmax(scores, dim=-1) @ vr[b, h, :valid]
    want = torch.autograd.grad(expected, (qr, vr), grad)
    tolerance = {} if dtype == torch.float64 else {"rtol": 1e-4, "atol": 1e-5}
    torch.testing.assert_close(out.double(), expected.detach(), **tolerance)
    for g, w in zip(got, want):
        torch.testing.assert_close(g.double(), w, **tolerance)

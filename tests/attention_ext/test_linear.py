"""linear attention against a dense brute force written here: the N x N matrix of
phi(q_i) . phi(k_j) over the valid keys, row-normalised (with the fixed eps), times V."""
import pytest
import torch
from torch._dynamo.testing import CompileCounterWithBackend

from attention_ext import AttentionConfigError, available_attentions, build_attention, parse_attention_spec
from attention_ext.attentions import linear as linear_module

from random_inputs import on, random_qkv

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


# ---- the chunked computation ---------------------------------------------------------------------
# attention_ext.attentions.linear works over the sequence in chunks of CHUNK_POSITIONS positions (one autograd
# Function, gradients derived by hand); the tests make the chunk 4 positions long, so 3 positions
# are one partial chunk, 4 exactly one (whose phi and products the backward keeps) and 13 three
# full chunks and a partial one (recomputed in the backward).

CHUNK = 4


@pytest.fixture
def small_chunks(monkeypatch):
    monkeypatch.setattr(linear_module, "CHUNK_POSITIONS", CHUNK)


def dense_float64(q, k, v, lengths):
    """The brute force above on float64 copies on the CPU, differentiable back to q, k, v."""
    return brute_force_linear(*(x.cpu().double() for x in (q, k, v)), lengths.cpu())


def assert_matches_dense(q, k, v, lengths, *, rtol=1e-7, atol=1e-9, grad_rtol=None, grad_atol=None):
    out = build_attention("linear")(q, k, v, lengths)
    expected = dense_float64(q, k, v, lengths)
    assert out.dtype == v.dtype and out.device == v.device
    torch.testing.assert_close(out.cpu().double(), expected, rtol=rtol, atol=atol)
    grad = torch.randn(out.shape, dtype=torch.float64, generator=torch.Generator().manual_seed(9))
    got = torch.autograd.grad(out, (q, k, v), grad.to(out))
    want = torch.autograd.grad(expected, (q, k, v), grad, allow_unused=True, materialize_grads=True)
    for name, g, w, x in zip("qkv", got, want, (q, k, v)):
        assert g.dtype == x.dtype, name
        torch.testing.assert_close(g.cpu().double(), w.cpu().double(), rtol=grad_rtol or rtol,
                                   atol=grad_atol or atol, msg=lambda m: f"grad {name}: {m}")
    return out, got


@pytest.mark.parametrize("length", [3, CHUNK, 13])
@pytest.mark.parametrize("lengths", ["full", "padded"])
def test_chunks_match_the_dense_float64_formula(small_chunks, device, length, lengths):
    q, k, v = random_qkv((2, 3, length, 5), seed=length)
    v = torch.randn(2, 3, length, 6, dtype=torch.float64, generator=torch.Generator().manual_seed(1)).requires_grad_()
    q, k, v = on(device, q, k, v)
    lengths = torch.tensor([length, length] if lengths == "full" else [length, max(1, length - 6)], device=device)
    out, grads = assert_matches_dense(q, k, v, lengths)
    n = int(lengths[1])
    assert torch.all(out[1, :, n:] == 0) and all(torch.all(g[1, :, n:] == 0) for g in grads)


def test_no_lengths_is_the_full_length_over_several_chunks(small_chunks):
    q, k, v = random_qkv((1, 2, 10, 3), seed=11)
    out = build_attention("linear")(q, k, v)
    torch.testing.assert_close(out, dense_float64(q, k, v, torch.tensor([10])))


@pytest.mark.parametrize("chunk", [2, 3, 5, 64])
def test_gradcheck_over_chunks_with_padding(monkeypatch, chunk):
    monkeypatch.setattr(linear_module, "CHUNK_POSITIONS", chunk)
    q, k, v = random_qkv((2, 2, 7, 3), seed=12)
    lengths = torch.tensor([7, 4])
    assert torch.autograd.gradcheck(lambda q, k, v: build_attention("linear")(q, k, v, lengths), (q, k, v))


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), -float("inf")])
@pytest.mark.parametrize("length", [CHUNK, 11])
def test_non_finite_padded_inputs_change_nothing_over_chunks(small_chunks, bad, length):
    """A NaN or inf in padded q, k or v, in any chunk: outputs and gradients of the valid rows as
    without padding, padded rows and their gradients exactly 0, everything finite."""
    valid = length - 3
    q, k, v = random_qkv((2, 2, length, 3), seed=13)
    lengths = torch.tensor([valid, length])
    with torch.no_grad():
        for x in (q, k, v):
            x[0, :, valid:] = bad
    out = build_attention("linear")(q, k, v, lengths)
    grads = torch.autograd.grad(out, (q, k, v), torch.ones_like(out))
    assert torch.isfinite(out).all() and all(torch.isfinite(g).all() for g in grads)
    assert torch.all(out[0, :, valid:] == 0) and all(torch.all(g[0, :, valid:] == 0) for g in grads)
    alone = [x[:1, :, :valid].detach().requires_grad_() for x in (q, k, v)]
    expected = build_attention("linear")(*alone)
    torch.testing.assert_close(out[:1, :, :valid], expected)
    for g, w in zip(grads, torch.autograd.grad(expected, alone, torch.ones_like(expected))):
        torch.testing.assert_close(g[:1, :, :valid], w)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("length", [3, 13])
def test_half_precision_inputs_are_summed_in_float32(small_chunks, dtype, length):
    """Half-precision q, k, v: computed in float32 (contract.compute_dtype) chunk by chunk, output
    and gradients in the input dtype, within the input's rounding of the float64 formula."""
    q, k, v = random_qkv((2, 2, length, 4), seed=14)
    q, k, v = (x.detach().to(dtype).requires_grad_() for x in (q, k, v))
    lengths = torch.tensor([length, length - 2])
    tolerance = dict(rtol=2e-2, atol=2e-2) if dtype == torch.bfloat16 else dict(rtol=2e-3, atol=2e-3)
    assert_matches_dense(q, k, v, lengths, **tolerance)


def test_float32_inputs_under_autocast_give_the_float32_result(small_chunks):
    q, k, v = (x.detach().float().requires_grad_() for x in random_qkv((2, 2, 13, 4), seed=15))
    lengths = torch.tensor([13, 6])
    plain = build_attention("linear")(q, k, v, lengths)
    plain_grads = torch.autograd.grad(plain.square().sum(), (q, k, v))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        autocast = build_attention("linear")(q, k, v, lengths)
        autocast_grads = torch.autograd.grad(autocast.square().sum(), (q, k, v))
    assert autocast.dtype == torch.float32
    torch.testing.assert_close(autocast, plain, rtol=0, atol=0)
    for g, w in zip(autocast_grads, plain_grads):
        torch.testing.assert_close(g, w, rtol=0, atol=0)


@pytest.mark.parametrize("length", [CHUNK, 13])
def test_the_backward_keeps_only_the_inputs_and_the_key_value_product(small_chunks, length):
    """Saved for the backward: q, k, v, the padding mask and the (E, Ev + 1) product per head;
    over several chunks nothing else (memory linear in N with no per-position intermediates),
    in one chunk also its phi(q), phi(k) and [num, den] (what the backward would recompute)."""
    q, k, v = random_qkv((2, 3, length, 5), seed=16)
    saved = []

    def pack(tensor):
        saved.append(tuple(tensor.shape))
        return tensor

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
        build_attention("linear")(q, k, v, torch.tensor([length, 2]))
    inputs = [(2, 3, length, 5)] * 3 + [(2, 1, length, 1), (2, 3, 5, 6)]
    kept = [(2, 3, length, 5), (2, 3, length, 5), (2, 3, length, 6)] if length <= CHUNK else []
    assert sorted(saved) == sorted(inputs + kept)


@pytest.mark.parametrize("length", [CHUNK, 13])
def test_two_backwards_of_one_graph_agree_and_grads_follow_needs(small_chunks, length):
    q, k, v = random_qkv((1, 2, length, 3), seed=17)
    out = build_attention("linear")(q, k, v, torch.tensor([length - 1]))
    first = torch.autograd.grad(out.sum(), (q, k, v), retain_graph=True)
    second = torch.autograd.grad(out.sum(), (q, k, v))
    for a, b in zip(first, second):
        torch.testing.assert_close(a, b, rtol=0, atol=0)
    for wanted in ((q,), (k,), (v,), (k, v), (q, v)):   # the backward skips what is not asked for
        out = build_attention("linear")(q, k, v, torch.tensor([length - 1]))
        got = torch.autograd.grad(out.sum(), wanted)
        for x, g in zip(wanted, got):
            torch.testing.assert_close(g, first[[id(y) for y in (q, k, v)].index(id(x))], rtol=0, atol=0)


def test_double_backward_is_refused_with_a_clear_error():
    q, k, v = random_qkv((1, 1, 5, 2), seed=18)
    out = build_attention("linear")(q, k, v)
    with pytest.raises(RuntimeError, match=r"linear attention .* has no double backward"):
        torch.autograd.grad(out.sum(), q, create_graph=True)


def test_a_non_finite_valid_value_keeps_padded_rows_zero_and_other_sequences_unchanged(small_chunks):
    """The contract (attention_ext/README.md): an inf in sequence 0's valid values may make its
    output non-finite, but its padded output rows (and here their gradients) stay 0, and
    sequence 1 gets what it gets alone."""
    q, k, v = random_qkv((2, 2, 13, 3), seed=19)
    with torch.no_grad():
        v[0, :, 2] = float("inf")
    out = build_attention("linear")(q, k, v, torch.tensor([9, 13]))
    grads = torch.autograd.grad(out, (q, k, v), torch.ones_like(out))
    assert not torch.isfinite(out[0, :, :9]).all()
    assert torch.all(out[0, :, 9:] == 0) and all(torch.all(g[0, :, 9:] == 0) for g in grads)
    alone = [x[1:].detach().requires_grad_() for x in (q, k, v)]
    expected = build_attention("linear")(*alone)
    torch.testing.assert_close(out[1:], expected)
    for g, w in zip(grads, torch.autograd.grad(expected, alone, torch.ones_like(expected))):
        torch.testing.assert_close(g[1:], w)


def test_compiled_with_symbolic_lengths_matches_eager_over_several_chunks(small_chunks):
    """torch.compile traces the whole sequence as one chunk (one graph for every length), eager
    runs several: the same output and gradients."""
    attention = build_attention("linear")
    counter = CompileCounterWithBackend("aot_eager")
    compiled = torch.compile(attention, fullgraph=True, backend=counter, dynamic=True)
    try:
        for length in (13, 6, 9):
            q, k, v = random_qkv((2, 2, length, 3), seed=length)
            lengths = torch.tensor([length, length - 4])
            expected = attention(q, k, v, lengths)
            got = compiled(q, k, v, lengths)
            torch.testing.assert_close(got, expected)
            for g, w in zip(torch.autograd.grad(got.square().sum(), (q, k, v)),
                            torch.autograd.grad(expected.square().sum(), (q, k, v))):
                torch.testing.assert_close(g, w)
        assert counter.frame_count == 1
    finally:
        torch._dynamo.reset()

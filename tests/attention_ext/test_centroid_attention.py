"""The fused CPU kernel of clustered attention's dense part (csrc/centroid_attention.cpp):
V^c = softmax(Q^c K^T) V over the valid keys and its gradients, against plain torch math on
the whole (C, N) matrix. The kernel takes the keys in blocks whose width depends on C and the
dtype (about 256 KiB of scores per head, a multiple of 64 keys, at least 64), so the shapes
below give several blocks, a last block that is not full and not a multiple of 64 or 16,
sequences that end inside a block, before the last block, and at length 0 or 1."""
import pytest
import torch

from attention_ext._ops import ops
from attention_ext.attentions.clustered import CentroidValues


def reference(centroids, k, v, lengths):
    """softmax(centroids k^T) v with keys >= length masked (length 0 keeps key 0)."""
    scores = centroids @ k.transpose(-1, -2)
    valid = torch.arange(k.shape[2]) < lengths.clamp(min=1)[:, None]
    weights = torch.softmax(scores.masked_fill(~valid[:, None, None, :], float("-inf")), -1)
    return weights @ v


def block_of(clusters, dtype):
    size = torch.finfo(dtype).bits // 8
    return max(64, min(2048, (256 * 1024) // (clusters * size) // 64 * 64))


# (clusters, length, lengths, dtype): float64 with 300 clusters takes blocks of 64 keys,
# float32 with 300 clusters blocks of 192.
CASES = [
    (300, 203, [203, 130, 64, 1, 0], torch.float64),
    (300, 450, [450, 193, 383, 2], torch.float32),
    (7, 37, [37, 5], torch.float32),
]


@pytest.mark.parametrize("clusters,length,lengths,dtype", CASES)
def test_values_and_gradients_match_dense_softmax(clusters, length, lengths, dtype):
    assert block_of(clusters, dtype) < length or clusters == 7
    generator = torch.Generator().manual_seed(clusters + length)
    batch, heads, dim, value_dim = len(lengths), 2, 16, 24
    lengths = torch.tensor(lengths)
    centroids = torch.randn(batch, heads, clusters, dim, dtype=torch.float64, generator=generator) * 0.7
    k = torch.randn(batch, heads, length, dim, dtype=torch.float64, generator=generator)
    v = torch.randn(batch, heads, length, value_dim, dtype=torch.float64, generator=generator)
    grad = torch.randn(batch, heads, clusters, value_dim, dtype=torch.float64, generator=generator)

    leaves = [x.clone().requires_grad_() for x in (centroids, k, v)]
    expected = reference(*leaves, lengths)
    expected.backward(grad)

    inputs = [x.to(dtype).requires_grad_() for x in (centroids, k, v)]
    values = CentroidValues.apply(*inputs, lengths)
    values.backward(grad.to(dtype))
    tolerance = dict(atol=1e-5, rtol=1e-4) if dtype == torch.float32 else dict(atol=1e-12, rtol=1e-10)
    torch.testing.assert_close(values.double(), expected, **tolerance)
    for mine, theirs in zip(inputs, leaves):
        torch.testing.assert_close(mine.grad.double(), theirs.grad, **tolerance)
    # padded keys get exactly zero gradients
    for b, valid in enumerate(lengths.clamp(min=1).tolist()):
        assert torch.all(inputs[1].grad[b, :, valid:] == 0) and torch.all(inputs[2].grad[b, :, valid:] == 0)


def test_logsumexp_is_that_of_the_valid_scores():
    generator = torch.Generator().manual_seed(3)
    centroids, k = (torch.randn(2, 1, n, 8, dtype=torch.float64, generator=generator) for n in (300, 150))
    v = torch.randn(2, 1, 150, 8, dtype=torch.float64, generator=generator)
    lengths = torch.tensor([150, 70])
    _, logsumexp = ops.centroid_attention(centroids, k, v, lengths)
    scores = centroids @ k.transpose(-1, -2)
    torch.testing.assert_close(logsumexp[0], scores[0].logsumexp(-1))
    torch.testing.assert_close(logsumexp[1], scores[1, ..., :70].logsumexp(-1))


def test_float32_exponential_is_accurate_over_its_range():
    # One centroid, keys whose scores span the float range the kernel's exp sees after the
    # maximum is subtracted (0 down to below -87, where it returns 0).
    scores = torch.cat([torch.linspace(-100.0, 0.0, 4001), torch.tensor([0.0])])
    centroids = torch.ones(1, 1, 1, 1)
    k = scores.view(1, 1, -1, 1)
    v = torch.eye(scores.numel()).view(1, 1, scores.numel(), scores.numel())
    values, _ = ops.centroid_attention(centroids, k, v, torch.tensor([scores.numel()]))
    expected = torch.softmax(scores.double(), -1)
    torch.testing.assert_close(values.view(-1).double(), expected, atol=1e-12, rtol=2e-6)


def test_results_do_not_depend_on_threads():
    generator = torch.Generator().manual_seed(5)
    centroids = torch.randn(1, 2, 300, 16, generator=generator)
    k, v = (torch.randn(1, 2, 700, 16, generator=generator) for _ in range(2))
    lengths = torch.tensor([650])
    grad = torch.randn(1, 2, 300, 16, generator=generator)
    previous = torch.get_num_threads()
    results = []
    try:
        for threads in (1, 2):
            torch.set_num_threads(threads)
            values, logsumexp = ops.centroid_attention(centroids, k, v, lengths)
            results.append((values, logsumexp, *ops.centroid_attention_backward(
                grad, centroids, k, v, lengths, values, logsumexp)))
    finally:
        torch.set_num_threads(previous)
    for serial, parallel in zip(*results):
        assert torch.equal(serial, parallel)


def test_bad_shapes_are_refused_with_the_argument_named():
    centroids, k = torch.randn(1, 2, 3, 4), torch.randn(1, 2, 5, 4)
    with pytest.raises(RuntimeError, match="v must have shape"):
        ops.centroid_attention(centroids, k, torch.randn(1, 2, 6, 4), torch.tensor([5]))
    with pytest.raises(RuntimeError, match="k must have shape"):
        ops.centroid_attention(centroids, torch.randn(1, 2, 5, 3), torch.randn(1, 2, 5, 4), torch.tensor([5]))
    with pytest.raises(RuntimeError, match="lengths"):
        ops.centroid_attention(centroids, k, torch.randn(1, 2, 5, 4), torch.tensor([5, 5]))


# ------------------------------------------------------------- with the top-k split (iclustered)

from attention_ext.attentions.iclustered import CentroidTopSplit  # noqa: E402


def reference_top(centroids, k, v, lengths, topk, given_top=None):
    """T by sorting each row of A^c (ties to the lower position, only valid keys), or
    `given_top`; then m = sum_T A^c and V^b = sum_{not T} A^c v, all dense."""
    length = k.shape[2]
    scores = centroids @ k.transpose(-1, -2)
    valid = torch.arange(length) < lengths.clamp(min=1)[:, None]
    weights = torch.softmax(scores.masked_fill(~valid[:, None, None, :], float("-inf")), -1)
    slots = min(topk, length)
    top = torch.full(weights.shape[:3] + (slots,), -1, dtype=torch.long)
    on_top = torch.zeros_like(weights, dtype=torch.bool)
    for b, real in enumerate(lengths.clamp(0, length).tolist()):
        kept = min(slots, real)
        for h in range(weights.shape[1]):
            for c in range(weights.shape[2]):
                row = weights[b, h, c, :real].detach().tolist()
                order = sorted(range(real), key=lambda l: (-row[l], l))[:kept]
                if given_top is not None:
                    order = given_top[b, h, c, :kept].tolist()
                top[b, h, c, :kept] = torch.tensor(order, dtype=torch.long)
                on_top[b, h, c, order] = True
    mass = (weights * on_top).sum(-1, keepdim=True)
    rest = (weights * ~on_top) @ v
    return rest, mass, top


TOP_CASES = [
    (300, 203, [203, 130, 64, 1, 0], 32, torch.float64),
    (300, 450, [450, 193, 383, 2], 32, torch.float32),
    (7, 37, [37, 5], 8, torch.float32),
    (5, 20, [20, 12], 40, torch.float64),     # topk larger than every sequence: m = 1, V^b = 0
]


@pytest.mark.parametrize("clusters,length,lengths,topk,dtype", TOP_CASES)
def test_top_split_matches_dense_topk_mass_and_rest(clusters, length, lengths, topk, dtype):
    generator = torch.Generator().manual_seed(clusters * 7 + length)
    batch, heads, dim, value_dim = len(lengths), 2, 16, 24
    lengths = torch.tensor(lengths)
    centroids = torch.randn(batch, heads, clusters, dim, dtype=torch.float64, generator=generator)
    k = torch.randn(batch, heads, length, dim, dtype=torch.float64, generator=generator)
    v = torch.randn(batch, heads, length, value_dim, dtype=torch.float64, generator=generator)
    grad_rest = torch.randn(batch, heads, clusters, value_dim, dtype=torch.float64, generator=generator)
    grad_mass = torch.randn(batch, heads, clusters, 1, dtype=torch.float64, generator=generator)

    inputs = [x.to(dtype).requires_grad_() for x in (centroids, k, v)]
    my_rest, my_mass, my_top = CentroidTopSplit.apply(*inputs, lengths, topk)
    leaves = [x.detach().double().requires_grad_() for x in inputs]
    _, _, top = reference_top(*leaves, lengths, topk)
    if dtype == torch.float64:
        assert torch.equal(my_top, top)
    else:   # float32 scores may order near-equal keys differently: T must still be a top-k
        assert torch.equal(my_top < 0, top < 0)
        scores = leaves[0] @ leaves[1].transpose(-1, -2)
        chosen = scores.gather(-1, my_top.clamp(min=0)).masked_fill(my_top < 0, float("inf")).amin(-1)
        best = scores.gather(-1, top.clamp(min=0)).masked_fill(top < 0, float("inf")).amin(-1)
        assert torch.all(chosen >= best - 1e-5)
    rest, mass, _ = reference_top(*leaves, lengths, topk, given_top=my_top)
    (rest * grad_rest).sum().add((mass * grad_mass).sum()).backward()
    (my_rest * grad_rest.to(dtype)).sum().add((my_mass * grad_mass.to(dtype)).sum()).backward()
    tolerance = dict(atol=2e-5, rtol=1e-4) if dtype == torch.float32 else dict(atol=1e-12, rtol=1e-10)
    torch.testing.assert_close(my_rest.double(), rest, **tolerance)
    torch.testing.assert_close(my_mass.double(), mass, **tolerance)
    for mine, theirs in zip(inputs, leaves):
        torch.testing.assert_close(mine.grad.double(), theirs.grad, **tolerance)
    if topk >= length:
        assert torch.all(my_rest == 0)


def test_top_backward_adds_into_the_key_and_value_gradients_it_is_given():
    """centroid_attention_top_backward adds its key and value gradients to what grad_k and grad_v
    hold (the top-key part's, which is 0 on padded keys: those rows end 0), and refuses targets of
    another shape, naming them."""
    generator = torch.Generator().manual_seed(3)
    lengths = torch.tensor([40, 23])
    centroids = torch.randn(2, 2, 6, 8, dtype=torch.float64, generator=generator)
    k = torch.randn(2, 2, 40, 8, dtype=torch.float64, generator=generator)
    v = torch.randn(2, 2, 40, 8, dtype=torch.float64, generator=generator)
    rest, mass, top, logsumexp = ops.centroid_attention_top(centroids, k, v, lengths, 5)
    grad_rest, grad_mass = torch.randn_like(rest), torch.randn_like(mass)
    arguments = (grad_rest, grad_mass, centroids, k, v, lengths, rest, mass, top, logsumexp)
    fresh_k, fresh_v = torch.zeros_like(k), torch.zeros_like(v)
    grad_centroids = ops.centroid_attention_top_backward(*arguments, fresh_k, fresh_v)
    start_k, start_v = torch.randn_like(k), torch.randn_like(v)
    start_k[1, :, 23:] = 0
    start_v[1, :, 23:] = 0
    summed_k, summed_v = start_k.clone(), start_v.clone()
    again = ops.centroid_attention_top_backward(*arguments, summed_k, summed_v)
    torch.testing.assert_close(again, grad_centroids, atol=1e-12, rtol=1e-12)
    torch.testing.assert_close(summed_k, start_k + fresh_k, atol=1e-12, rtol=1e-12)
    torch.testing.assert_close(summed_v, start_v + fresh_v, atol=1e-12, rtol=1e-12)
    assert torch.all(summed_k[1, :, 23:] == 0) and torch.all(summed_v[1, :, 23:] == 0)
    with pytest.raises(RuntimeError, match="grad_k and grad_v must be contiguous, with k's shape"):
        ops.centroid_attention_top_backward(*arguments, torch.zeros(2, 2, 39, 8, dtype=torch.float64), fresh_v)


def test_top_split_ties_go_to_the_lower_position():
    # Every key appears three times (positions l, l + 20, l + 40): equal scores.
    generator = torch.Generator().manual_seed(11)
    centroids = torch.randn(1, 1, 300, 8, dtype=torch.float64, generator=generator)
    k = torch.randn(1, 1, 20, 8, dtype=torch.float64, generator=generator).repeat(1, 1, 3, 1)
    v = torch.randn(1, 1, 60, 4, dtype=torch.float64, generator=generator)
    lengths = torch.tensor([60])
    _, _, top = CentroidTopSplit.apply(centroids, k, v, lengths, 10)
    _, _, expected = reference_top(centroids, k, v, lengths, 10)
    assert torch.equal(top, expected)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("order", ["ascending", "descending", "random"])
def test_top_split_keeps_the_top_keys_when_every_key_enters_the_pool(order, dtype):
    # Scores that grow along the sequence put every key above the floor of the candidates
    # kept so far, so the pool of top-k candidates fills and is cut back many times within
    # each block of keys (4 clusters take blocks of 2048 keys); the other orders are the
    # easy case and the usual one. float32 takes the vector path where the CPU has AVX-512
    # (16 keys per compare), float64 the scalar one.
    generator = torch.Generator().manual_seed(5)
    length, topk = 5000, 3
    position = torch.arange(length, dtype=torch.float64)
    ramp = {"ascending": position, "descending": -position,
            "random": torch.randn(length, dtype=torch.float64, generator=generator)}[order]
    k = torch.randn(1, 1, length, 8, dtype=torch.float64, generator=generator) * 1e-3
    k[..., 0] += ramp / length
    centroids = torch.randn(1, 1, 4, 8, dtype=torch.float64, generator=generator)
    centroids[..., 0] = torch.tensor([4.0, 1.0, -2.0, 0.5])
    v = torch.randn(1, 1, length, 2, dtype=torch.float64, generator=generator)
    lengths = torch.tensor([length - 7])
    _, _, top = CentroidTopSplit.apply(centroids.to(dtype), k.to(dtype), v.to(dtype), lengths, topk)
    scores = (centroids @ k.transpose(-1, -2))[..., :length - 7]
    assert torch.equal(top, scores.topk(topk, dim=-1).indices)

"""The fused CPU kernel of clustered attention's dense part (csrc/centroid_attention.cpp):
V^c = softmax(Q^c K^T) V over the valid keys and its gradients, against plain torch math on
the whole (C, N) matrix. The kernel takes the keys in blocks whose width depends on C and the
dtype (about 256 KiB of scores per head, a multiple of 64 keys, at least 64), so the shapes
below give several blocks, a last block that is not full and not a multiple of 64 or 16,
sequences that end inside a block, before the last block, and at length 0 or 1."""
import pytest
import torch

from attention_ext._ops import ops
from attention_ext.clustered import CentroidValues


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

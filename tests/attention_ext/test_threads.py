"""The compiled kernels give bit-identical results on one thread and on several.

at::parallel_for only runs in parallel when the extension is built with OpenMP, and the
kernels choose their split by the number of (batch, head)s against the number of
threads, so both paths (whole heads per task, clusters shared out) are compared with the
serial run here: a data race or a split-dependent sum shows up as a difference.
"""
import pytest
import torch

from attention_ext import _C
from attention_ext._ops import ops
from attention_ext.attentions.clustered import cluster_queries
from attention_ext.attentions.iclustered import top_keys
from attention_ext.attentions.lsh import lsh_hash


def test_kernels_run_on_torchs_threads(threads):
    # 1 here means the extension was built without OpenMP: every kernel would run serially.
    assert threads(2, _C.parallel_for_threads) == 2
    assert threads(1, _C.parallel_for_threads) == 1


def assert_identical(serial, parallel):
    for expected, actual in zip(serial, parallel):
        assert torch.equal(expected, actual)


def clustered_inputs(batch, heads, length, seed=0):
    generator = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(batch, heads, length, 32, generator=generator) for _ in range(3))
    lengths = torch.tensor([length, length - 300][:batch])
    torch.manual_seed(seed)
    clusters = cluster_queries(q, lengths, clusters=20, bits=31, iterations=5)
    scores = torch.randn(batch, heads, 20, length, generator=generator).softmax(-1)
    topk = top_keys(scores, lengths, 16)
    return q, k, v, lengths, clusters, scores, topk


# (1, 1): fewer (batch, head)s than threads, clusters shared out; (2, 3): whole heads per task.
@pytest.mark.parametrize("batch,heads", [(1, 1), (2, 3)])
def test_clustering_and_sparse_products_do_not_depend_on_threads(threads, batch, heads):
    q, k, v, lengths, clusters, scores, topk = clustered_inputs(batch, heads, 1500)
    offsets, members = clusters.offsets, clusters.members
    generator = torch.Generator().manual_seed(1)
    grad_dots = torch.randn(*q.shape[:3], topk.shape[-1], generator=generator)
    grad_rows = torch.randn(q.shape, generator=generator)
    planes, plane_offsets = torch.randn(31, 32, generator=generator), torch.randn(31, generator=generator)

    def run_all():
        codes = ops.hyperplane_hash(q, planes, plane_offsets, lengths)
        initial = ops.hamming_kmeans_init(codes, lengths, 20, 7)
        return (codes, initial, *ops.hamming_kmeans(codes, lengths, initial, 5, 31),
                *ops.group_by_cluster(clusters.assignment, 20),
                ops.cluster_mean(q, offsets, members),
                ops.cluster_mean_backward(grad_rows[:, :, :20], clusters.assignment, offsets),
                ops.cluster_broadcast(q[:, :, :20], clusters.assignment),
                ops.cluster_broadcast_backward(grad_rows, offsets, members),
                ops.cluster_topk(scores, lengths, 16),
                ops.clustered_sparse_dot(q, k, topk, offsets, members, 0.25),
                *ops.clustered_sparse_dot_backward(grad_dots, q, k, topk, offsets, members, 0.25),
                ops.clustered_sparse_weighted_sum(grad_dots, v, topk, offsets, members),
                *ops.clustered_sparse_weighted_sum_backward(grad_rows, grad_dots, v, topk, offsets,
                                                            members))

    serial = threads(1, run_all)
    assert_identical(serial, threads(2, run_all))
    assert_identical(serial, threads(3, run_all))


@pytest.mark.parametrize("batch,heads", [(1, 1), (2, 3)])
def test_lsh_kernels_do_not_depend_on_threads(threads, batch, heads):
    generator = torch.Generator().manual_seed(2)
    q, v = (torch.randn(batch, heads, 1500, 32, generator=generator) for _ in range(2))
    lengths = torch.tensor([1500, 1200][:batch])
    grad = torch.randn(q.shape, generator=generator)

    def run_all():
        hashing = lsh_hash(q, lengths, rounds=2, chunk_size=32, seed=0)
        out, lse = ops.lsh_attention_forward(q, v, hashing.order, lengths, 32)
        return (hashing.buckets, hashing.order, out, lse,
                *ops.lsh_attention_backward(grad, q, v, hashing.order, lengths, out, lse, 32))

    serial = threads(1, run_all)
    assert_identical(serial, threads(2, run_all))
    assert_identical(serial, threads(3, run_all))

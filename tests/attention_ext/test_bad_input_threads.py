"""Every bad-input check of the compiled CPU operators raises a Python exception, never a
crash, on one torch thread and on eight (more threads than cores is fine: at::parallel_for
still splits the work, so the parallel paths run).

The kernels check their inputs before any parallel region, or (lsh's order check, part of
the parallel work) let each task record what it found and raise after the region; see
attention_ext/csrc/input_checks.h. A case is an operator, a builder of its valid inputs, a
function of those inputs giving the arguments to replace, and the pattern the message matches.
"""
import re

import pytest
import torch

from attention_ext._ops import ops

BATCH, HEADS, LENGTH, DIM, CLUSTERS, SLOTS = 2, 2, 8, 4, 4, 3
LENGTHS = [LENGTH, LENGTH - 3]


@pytest.fixture(params=[1, 8], ids=["1-thread", "8-threads"])
def thread_count(request):
    """Runs the test under torch.set_num_threads(param), restoring the previous count."""
    previous = torch.get_num_threads()
    torch.set_num_threads(request.param)
    yield request.param
    torch.set_num_threads(previous)


def rows(dtype=torch.float32):
    return torch.randn(BATCH, HEADS, LENGTH, DIM, dtype=dtype)


def lengths():
    return torch.tensor(LENGTHS)


# --- lsh: the attention (forward and backward share their checks) and the hashing ---------

def lsh_attention_inputs():
    q = rows()
    order = torch.arange(LENGTH).expand(BATCH, HEADS, 2, LENGTH).clone()
    return dict(q=q, v=q.clone(), order=order, lengths=lengths(), chunk_size=4)


def lsh_attention_forward(q, v, order, lengths, chunk_size):
    return ops.lsh_attention_forward(q, v, order, lengths, chunk_size)


def lsh_attention_backward(q, v, order, lengths, chunk_size, grad_out=None):
    grad_out = torch.zeros_like(v) if grad_out is None else grad_out
    lse = torch.zeros(q.shape[:3], dtype=q.dtype)
    return ops.lsh_attention_backward(grad_out, q, v, order, lengths, torch.zeros_like(v), lse,
                                      chunk_size)


def with_entry(tensor, index, value):
    tensor[index] = value
    return tensor


LSH_ATTENTION_CASES = [
    ("q-not-4d", lambda x: dict(q=x["q"][0]), r"lsh attention: q must be \(B, H, N, E\)"),
    ("v-other-length", lambda x: dict(v=x["v"][:, :, :5]), r"v must share \(B, H, N\) with q"),
    ("v-other-dtype", lambda x: dict(v=x["v"].double()), "q and v must share one dtype"),
    ("chunk-size-0", lambda x: dict(chunk_size=0), "chunk_size must be >= 1, got 0"),
    ("order-shape", lambda x: dict(order=x["order"][:, :, :, :5]),
     r"order must be \(B, H, rounds, N\)"),
    ("lengths-shape", lambda x: dict(lengths=torch.tensor([8, 5, 5])), r"lengths must be \(B,\)"),
    ("length-too-long", lambda x: dict(lengths=torch.tensor([9, 5])),
     r"lengths\[0\] = 9 is outside \[0, 8\]"),
    ("order-repeats", lambda x: dict(order=with_entry(x["order"], (1, 1, 1, 3), 1)),
     re.escape("order[1, 1, 1, :5] must be a permutation of the valid positions 0..4, "
               "but order[1, 1, 1, 3] = 1 repeats an earlier entry")),
    ("order-out-of-range", lambda x: dict(order=with_entry(x["order"], (1, 0, 0, 2), 6)),
     re.escape("order[1, 0, 0, :5] must be a permutation of the valid positions 0..4, "
               "but order[1, 0, 0, 2] = 6 is outside that range")),
]


def lsh_hash_inputs():
    rotations = torch.randn(BATCH, HEADS, DIM, 2, 16)
    return dict(q=rows(), rotations=rotations, lengths=lengths(), half_buckets=torch.tensor([2, 2]))


def lsh_hash(q, rotations, lengths, half_buckets):
    return ops.lsh_hash(q, rotations, lengths, half_buckets)


LSH_HASH_CASES = [
    ("q-not-4d", lambda x: dict(q=x["q"][0]), r"lsh_hash: q must be \(B, H, N, E\)"),
    ("rotations-columns", lambda x: dict(rotations=x["rotations"][..., :10]),
     r"rotations must be \(B, H, E, R, P\) with P a multiple of 16"),
    ("rotations-dtype", lambda x: dict(rotations=x["rotations"].double()),
     "rotations must have the dtype of q"),
    ("lengths-shape", lambda x: dict(lengths=torch.tensor([8])),
     r"lengths and half_buckets must be \(B,\) = \(2,\)"),
    ("length-negative", lambda x: dict(lengths=torch.tensor([8, -1])),
     r"lsh_hash: lengths\[1\] = -1 is outside \[0, 8\]"),
    ("half-buckets-too-many", lambda x: dict(half_buckets=torch.tensor([2, 17])),
     r"half_buckets\[1\] = 17 is outside \[1, 16\]"),
]


# --- clustering: hashing and Hamming K-Means --------------------------------------------

def codes():
    return torch.zeros(BATCH, HEADS, LENGTH, dtype=torch.long)


def hyperplane_hash_inputs():
    return dict(queries=rows(), planes=torch.randn(5, DIM), offsets=torch.randn(5), lengths=lengths())


def hyperplane_hash(queries, planes, offsets, lengths):
    return ops.hyperplane_hash(queries, planes, offsets, lengths)


HYPERPLANE_HASH_CASES = [
    ("queries-not-4d", lambda x: dict(queries=x["queries"][0]),
     r"queries must have shape \(batch, heads, length, dim\)"),
    ("planes-dim", lambda x: dict(planes=torch.randn(5, DIM + 1)),
     r"planes must have shape \(bits, 4\)"),
    ("bits-64", lambda x: dict(planes=torch.randn(64, DIM), offsets=torch.randn(64)),
     "hyperplane_hash: bits must lie in 1..63, got 64"),
    ("offsets-shape", lambda x: dict(offsets=torch.randn(4)), r"offsets must have shape \(5\)"),
    ("lengths-int32", lambda x: dict(lengths=x["lengths"].int()),
     r"lengths must be an int64 tensor of shape \(2\)"),
]


def kmeans_init_inputs():
    return dict(codes=codes(), lengths=lengths(), clusters=CLUSTERS, seed=0)


def hamming_kmeans_init(codes, lengths, clusters, seed):
    return ops.hamming_kmeans_init(codes, lengths, clusters, seed)


KMEANS_INIT_CASES = [
    ("codes-float", lambda x: dict(codes=x["codes"].float()),
     r"codes must be an int64 tensor of shape \(batch, heads, length\)"),
    ("lengths-shape", lambda x: dict(lengths=torch.tensor([8])),
     r"lengths must be an int64 tensor of shape \(2\)"),
    ("clusters-0", lambda x: dict(clusters=0), "hamming_kmeans_init: clusters must be >= 1, got 0"),
]


def kmeans_inputs():
    centroids = torch.zeros(BATCH, HEADS, CLUSTERS, dtype=torch.long)
    return dict(codes=codes(), lengths=lengths(), centroids=centroids, iterations=2, bits=5)


def hamming_kmeans(codes, lengths, centroids, iterations, bits):
    return ops.hamming_kmeans(codes, lengths, centroids, iterations, bits)


KMEANS_CASES = [
    ("codes-2d", lambda x: dict(codes=x["codes"][0]), "codes must be an int64 tensor"),
    ("lengths-int32", lambda x: dict(lengths=x["lengths"].int()),
     r"lengths must be an int64 tensor of shape \(2\)"),
    ("centroids-shape", lambda x: dict(centroids=x["centroids"][:1]),
     r"centroids must be an int64 tensor of shape \(2, 2, clusters >= 1\)"),
    ("iterations-negative", lambda x: dict(iterations=-1), "iterations must be >= 0, got -1"),
    ("bits-0", lambda x: dict(bits=0), "hamming_kmeans: bits must lie in 1..63, got 0"),
    # 2^31 clusters without the memory: a stride-0 view
    ("too-many-clusters",
     lambda x: dict(centroids=torch.zeros(1, dtype=torch.long).expand(BATCH, HEADS, 2**31)),
     "hamming_kmeans: too many clusters: 2147483648"),
]


# --- per-cluster operations ---------------------------------------------------------------

def assignment():
    """Cluster i % CLUSTERS for every valid query, -1 for the padded ones."""
    assign = (torch.arange(LENGTH) % CLUSTERS).expand(BATCH, HEADS, LENGTH).clone()
    assign[1, :, LENGTHS[1]:] = -1
    return assign


def grouping():
    offsets, members = ops.group_by_cluster(assignment(), CLUSTERS)
    return offsets, members


def group_by_cluster_inputs():
    return dict(assignment=assignment(), clusters=CLUSTERS)


GROUP_BY_CLUSTER_CASES = [
    ("assignment-float", lambda x: dict(assignment=x["assignment"].float()),
     "assignment must be an int64 tensor with 3 dimensions"),
    ("clusters-0", lambda x: dict(clusters=0), "group_by_cluster: clusters must be >= 1, got 0"),
    ("cluster-id-too-large", lambda x: dict(assignment=with_entry(x["assignment"], (1, 1, 2), 4)),
     r"group_by_cluster: a cluster id is >= clusters \(4\)"),
]


def cluster_mean_inputs():
    offsets, members = grouping()
    return dict(x=rows(), offsets=offsets, members=members)


CLUSTER_MEAN_CASES = [
    ("x-int", lambda x: dict(x=x["x"].long()), "cluster_mean: x must be a floating tensor"),
    ("offsets-int32", lambda x: dict(offsets=x["offsets"].int()), "offsets must be an int64 tensor"),
    ("members-2d", lambda x: dict(members=x["members"][0]), "members must be an int64 tensor"),
    ("members-length", lambda x: dict(members=x["members"][:, :, :5]),
     "cluster_mean: members must have length 8"),
]


def cluster_mean_backward_inputs():
    return dict(grad=torch.randn(BATCH, HEADS, CLUSTERS, DIM), assignment=assignment(),
                offsets=grouping()[0])


CLUSTER_MEAN_BACKWARD_CASES = [
    ("grad-3d", lambda x: dict(grad=x["grad"][0]),
     "cluster_mean_backward: grad must be a floating tensor"),
    ("assignment-float", lambda x: dict(assignment=x["assignment"].float()),
     "assignment must be an int64 tensor"),
    ("offsets-float", lambda x: dict(offsets=x["offsets"].float()), "offsets must be an int64 tensor"),
    ("offsets-columns", lambda x: dict(offsets=x["offsets"][:, :, :4]),
     "cluster_mean_backward: offsets must have 5 columns"),
]


def cluster_broadcast_inputs():
    return dict(x=torch.randn(BATCH, HEADS, CLUSTERS, DIM), assignment=assignment())


CLUSTER_BROADCAST_CASES = [
    ("x-int", lambda x: dict(x=x["x"].long()), "cluster_broadcast: x must be a floating tensor"),
    ("assignment-2d", lambda x: dict(assignment=x["assignment"][0]),
     "assignment must be an int64 tensor"),
]


def cluster_broadcast_backward_inputs():
    offsets, members = grouping()
    return dict(grad=rows(), offsets=offsets, members=members)


CLUSTER_BROADCAST_BACKWARD_CASES = [
    ("grad-int", lambda x: dict(grad=x["grad"].long()),
     "cluster_broadcast_backward: grad must be a floating tensor"),
    ("offsets-2d", lambda x: dict(offsets=x["offsets"][0]), "offsets must be an int64 tensor"),
    ("members-int32", lambda x: dict(members=x["members"].int()), "members must be an int64 tensor"),
]


def cluster_topk_inputs():
    return dict(weights=torch.randn(BATCH, HEADS, CLUSTERS, LENGTH), lengths=lengths(), k=SLOTS)


CLUSTER_TOPK_CASES = [
    ("weights-3d", lambda x: dict(weights=x["weights"][0]),
     "cluster_topk: weights must be a floating tensor"),
    ("k-0", lambda x: dict(k=0), "cluster_topk: k must be >= 1, got 0"),
    ("lengths-int32", lambda x: dict(lengths=x["lengths"].int()),
     r"cluster_topk: lengths must be an int64 tensor of shape \(2\)"),
]


# --- sparse products and the fused top-key attention: all share check_sparse (input_checks.h) ---

def sparse_inputs():
    offsets, members = grouping()
    topk = torch.arange(SLOTS).expand(BATCH, HEADS, CLUSTERS, SLOTS).clone()
    return dict(rows=rows(), topk=topk, offsets=offsets, members=members)


def sparse_coefficients():
    return torch.randn(BATCH, HEADS, LENGTH, SLOTS)


def clustered_sparse_dot(rows, topk, offsets, members, k=None):
    return ops.clustered_sparse_dot(rows, rows if k is None else k, topk, offsets, members, 0.5)


def clustered_sparse_dot_backward(rows, topk, offsets, members, grad=None, k=None):
    grad = sparse_coefficients() if grad is None else grad
    return ops.clustered_sparse_dot_backward(grad, rows, rows if k is None else k, topk, offsets, members, 0.5)


def clustered_sparse_weighted_sum(rows, topk, offsets, members, weights=None):
    weights = sparse_coefficients() if weights is None else weights
    return ops.clustered_sparse_weighted_sum(weights, rows, topk, offsets, members)


def clustered_sparse_weighted_sum_backward(rows, topk, offsets, members, grad=None, weights=None):
    grad = torch.zeros_like(rows) if grad is None else grad
    weights = sparse_coefficients() if weights is None else weights
    return ops.clustered_sparse_weighted_sum_backward(grad, weights, rows, topk, offsets, members)


def top_mass():
    return torch.rand(BATCH, HEADS, CLUSTERS)


def clustered_top_attention(rows, topk, offsets, members, k=None, v=None, mass=None, rest=None):
    rest = torch.zeros(BATCH, HEADS, CLUSTERS, DIM) if rest is None else rest
    return ops.clustered_top_attention(rows, rows if k is None else k, rows if v is None else v, topk, offsets,
                                       members, top_mass() if mass is None else mass, rest, 0.5)


def clustered_top_attention_backward(rows, topk, offsets, members, k=None, v=None, mass=None, grad_out=None,
                                     weights=None):
    v = rows if v is None else v
    return ops.clustered_top_attention_backward(
        torch.zeros_like(v) if grad_out is None else grad_out, rows, rows if k is None else k, v, topk, offsets,
        members, top_mass() if mass is None else mass, sparse_coefficients() if weights is None else weights, 0.5)


SPARSE_OPERATORS = [clustered_sparse_dot, clustered_sparse_dot_backward, clustered_sparse_weighted_sum,
                    clustered_sparse_weighted_sum_backward, clustered_top_attention,
                    clustered_top_attention_backward]

# What both operators of clustered_top_attention.cpp check besides the sparse inputs.
TOP_ATTENTION_CASES = [
    ("k-shape", lambda x: dict(k=x["rows"][:, :, :5]), "k must match q"),
    ("v-length", lambda x: dict(v=x["rows"][:, :, :5]), r"v must have shape \(2, 2, 8, dim\) and q's dtype"),
    ("v-dtype", lambda x: dict(v=x["rows"].double()), r"v must have shape \(2, 2, 8, dim\) and q's dtype"),
    ("mass-4d", lambda x: dict(mass=top_mass()[..., None]), r"mass must have shape \(2, 2, 4\) and q's dtype"),
    ("topk-past-the-length", lambda x: dict(topk=with_entry(x["topk"], (1, 0, 2, 1), LENGTH)),
     r"topk holds positions outside \[-1, 8\)"),
    ("topk-below-minus-one", lambda x: dict(topk=with_entry(x["topk"], (0, 1, 0, 0), -2)),
     r"topk holds positions outside \[-1, 8\)"),
]

SHARED_SPARSE_CASES = [
    ("rows-3d", lambda x: dict(rows=x["rows"][0]),
     r"expected a floating tensor of shape \(batch, heads, length, dim\)"),
    ("topk-int32", lambda x: dict(topk=x["topk"].int()),
     r"topk must be int64 of shape \(2, 2, clusters, slots\)"),
    ("offsets-columns", lambda x: dict(offsets=x["offsets"][:, :, :3]),
     r"offsets must be int64 of shape \(2, 2, 5\)"),
    ("members-length", lambda x: dict(members=x["members"][:, :, :5]),
     r"members must be int64 of shape \[2, 2, 8\]"),
]

OWN_SPARSE_CASES = [
    (clustered_sparse_dot, "k-shape", lambda x: dict(k=x["rows"][:, :, :5]),
     r"clustered_sparse_dot: k must match q"),
    (clustered_sparse_dot_backward, "grad-shape", lambda x: dict(grad=sparse_coefficients()[..., :2]),
     r"clustered_sparse_dot_backward: grad must have shape \(2, 2, 8, 3\)"),
    # batch and heads of the gradient, and the keys, were not checked in the backward (out-of-bounds reads)
    (clustered_sparse_dot_backward, "grad-batch", lambda x: dict(grad=sparse_coefficients()[:1]),
     r"clustered_sparse_dot_backward: grad must have shape \(2, 2, 8, 3\)"),
    (clustered_sparse_dot_backward, "k-shape", lambda x: dict(k=x["rows"][:, :, :5]),
     r"clustered_sparse_dot_backward: k must match q"),
    (clustered_sparse_weighted_sum, "weights-dtype",
     lambda x: dict(weights=sparse_coefficients().double()),
     r"clustered_sparse_weighted_sum: weights must have shape \(2, 2, 8, 3\) and the rows' dtype"),
    (clustered_sparse_weighted_sum_backward, "grad-shape", lambda x: dict(grad=x["rows"][:, :1]),
     "clustered_sparse_weighted_sum_backward: grad must match v"),
    (clustered_sparse_weighted_sum_backward, "weights-heads", lambda x: dict(weights=sparse_coefficients()[:, :1]),
     r"clustered_sparse_weighted_sum_backward: weights must have shape \(2, 2, 8, 3\) and the rows' dtype"),
    (clustered_top_attention, "rest-dim", lambda x: dict(rest=torch.zeros(BATCH, HEADS, CLUSTERS, DIM + 1)),
     r"clustered_top_attention: rest must have shape \(2, 2, 4, 4\) and q's dtype"),
    (clustered_top_attention_backward, "grad-shape", lambda x: dict(grad_out=x["rows"][:, :1]),
     "clustered_top_attention_backward: grad_out must match v"),
    (clustered_top_attention_backward, "weights-slots", lambda x: dict(weights=sparse_coefficients()[..., :2]),
     r"clustered_top_attention_backward: weights must have shape \(2, 2, 8, 3\) and the rows' dtype"),
]


def cases():
    def of(operator, inputs, table):
        return [pytest.param(operator, inputs, changes, message, id=f"{operator.__name__}-{name}")
                for name, changes, message in table]
    return [
        *of(lsh_attention_forward, lsh_attention_inputs, LSH_ATTENTION_CASES),
        *of(lsh_attention_backward, lsh_attention_inputs, LSH_ATTENTION_CASES),
        pytest.param(lsh_attention_backward, lsh_attention_inputs,
                     lambda x: dict(grad_out=x["v"][:, :, :5]),
                     "grad_out and out must have the shape of v",
                     id="lsh_attention_backward-grad-shape"),
        *of(lsh_hash, lsh_hash_inputs, LSH_HASH_CASES),
        *of(hyperplane_hash, hyperplane_hash_inputs, HYPERPLANE_HASH_CASES),
        *of(hamming_kmeans_init, kmeans_init_inputs, KMEANS_INIT_CASES),
        *of(hamming_kmeans, kmeans_inputs, KMEANS_CASES),
        *of(ops.group_by_cluster, group_by_cluster_inputs, GROUP_BY_CLUSTER_CASES),
        *of(ops.cluster_mean, cluster_mean_inputs, CLUSTER_MEAN_CASES),
        *of(ops.cluster_mean_backward, cluster_mean_backward_inputs, CLUSTER_MEAN_BACKWARD_CASES),
        *of(ops.cluster_broadcast, cluster_broadcast_inputs, CLUSTER_BROADCAST_CASES),
        *of(ops.cluster_broadcast_backward, cluster_broadcast_backward_inputs,
            CLUSTER_BROADCAST_BACKWARD_CASES),
        *of(ops.cluster_topk, cluster_topk_inputs, CLUSTER_TOPK_CASES),
        *(case for operator in SPARSE_OPERATORS
          for case in of(operator, sparse_inputs, SHARED_SPARSE_CASES)),
        *(case for operator, name, changes, message in OWN_SPARSE_CASES
          for case in of(operator, sparse_inputs, [(name, changes, message)])),
        *(case for operator in (clustered_top_attention, clustered_top_attention_backward)
          for case in of(operator, sparse_inputs, TOP_ATTENTION_CASES)),
    ]


@pytest.mark.parametrize("operator,inputs,changes,message", cases())
def test_bad_input_raises_with_its_message(thread_count, operator, inputs, changes, message):
    arguments = inputs()
    operator(**arguments)  # the valid inputs pass
    arguments = inputs()
    arguments.update(changes(arguments))
    with pytest.raises(RuntimeError, match=message):
        operator(**arguments)


# --- lsh's order check runs inside the parallel region: inputs large enough to split ------

def long_lsh_inputs(length=16384):
    """16 (batch, head, round) tasks of 16384 positions: index_chunks' grain is 2 tasks, so 8
    threads run it on 8 workers."""
    q = torch.randn(2, 4, length, 2)
    order = torch.arange(length).expand(2, 4, 2, length).clone()
    return dict(q=q, v=q.clone(), order=order, lengths=torch.tensor([length, length - 100]),
                chunk_size=32)


def test_a_bad_order_found_by_a_worker_is_raised_after_the_region(thread_count):
    """The last task's bad entry is found on a worker thread; the same message either way."""
    arguments = long_lsh_inputs()
    arguments["order"][1, 3, 1, 16000] = 5  # the last (batch, head, round)
    with pytest.raises(RuntimeError, match=re.escape(
            "order[1, 3, 1, :16284] must be a permutation of the valid positions 0..16283, "
            "but order[1, 3, 1, 16000] = 5 repeats an earlier entry")):
        lsh_attention_forward(**arguments)


def test_the_first_bad_task_is_reported_whatever_the_thread_count(thread_count):
    arguments = long_lsh_inputs()
    arguments["order"][1, 3, 1, 5] = -2
    arguments["order"][0, 2, 0, 9000] = 20000
    with pytest.raises(RuntimeError, match=re.escape(
            "order[0, 2, 0, :16384] must be a permutation of the valid positions 0..16383, "
            "but order[0, 2, 0, 9000] = 20000 is outside that range")):
        lsh_attention_backward(**arguments)


def test_a_valid_call_after_a_refused_order_matches_the_serial_result(thread_count):
    arguments = long_lsh_inputs()
    bad_order = arguments["order"].clone()
    bad_order[0, 1, 1, 7] = 8
    with pytest.raises(RuntimeError, match="permutation of the valid positions"):
        lsh_attention_forward(**{**arguments, "order": bad_order})
    out, lse = lsh_attention_forward(**arguments)
    torch.set_num_threads(1)
    serial_out, serial_lse = lsh_attention_forward(**arguments)
    assert torch.equal(out, serial_out) and torch.equal(lse, serial_lse)

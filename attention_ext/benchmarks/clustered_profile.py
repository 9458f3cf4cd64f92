"""Where the time of clustered / i-clustered attention goes, stage by stage, on the CPU.

    python -m attention_ext.benchmarks.clustered_profile --lengths 4096 32768
    python -m attention_ext.benchmarks.clustered_profile --attentions iclustered --threads 1 --clock cpu

The i-clustered stages are those of its CPU route: the fused centroid pass (T, m, V^b) and the
fused top-key attention (V^t + V^b), each with its backward.

Runs the stages of `ClusteredAttention` / `ImprovedClusteredAttention` (forward, then the
backward of each stage in reverse order) as separate calls on the benchmark's shapes
(batch 1, 6 heads x 64, float32, random normal inputs) and prints the median milliseconds of
each, so a slow kernel shows by name. The stages compute exactly what the attention modules
compute; the forward+backward total is close to, not identical to, what
`python -m attention_ext.benchmarks.speed` measures for one pass (that one goes through autograd).
"""
from __future__ import annotations

import argparse
import math
import statistics
import time
from collections import defaultdict

import torch

from .._ops import ops
from ..attentions.clustered import cluster_slots
from ..contract import draw_seed, hashing_dtype


class StageTimer:
    """Accumulates the wall-clock time of named stages over repeated passes."""

    def __init__(self, clock=time.perf_counter):
        self.clock = clock
        self.times: dict[str, list[float]] = defaultdict(list)
        self.order: list[str] = []
        self.current: dict[str, float] = {}

    def start_pass(self):
        self.current = {}

    def __call__(self, name, fn, *args):
        start = self.clock()
        result = fn(*args)
        elapsed = (self.clock() - start) * 1e3
        if name not in self.order:
            self.order.append(name)
        self.current[name] = self.current.get(name, 0.0) + elapsed
        return result

    def end_pass(self):
        for name, value in self.current.items():
            self.times[name].append(value)

    def medians(self):
        return {name: statistics.median(self.times[name]) for name in self.order}


def clustered_pass(timer: StageTimer, q, k, v, grad_out, clusters, bits, iterations, topk=None):
    """One forward+backward of (i-)clustered attention, stage by stage, without autograd
    (batch without padding, as the benchmark calls it). Returns the forward's output, which
    equals the attention module's for the same torch seed (tested)."""
    batch, heads, length, dim = q.shape
    lengths = torch.full((batch,), length, dtype=torch.long)
    slots = cluster_slots(clusters, length)
    scale = 1.0 / math.sqrt(dim)

    # -- clustering (the cluster_queries operator, split into its kernels) --
    planes = torch.randn(bits, dim, dtype=hashing_dtype(q.dtype))
    plane_offsets = torch.randn(bits, dtype=hashing_dtype(q.dtype))
    seed = draw_seed()
    codes = timer("hash", ops.hyperplane_hash, q, planes, plane_offsets, lengths)
    initial = timer("kmeans init", ops.hamming_kmeans_init, codes, lengths, slots, seed)
    assignment, _ = timer("kmeans", ops.hamming_kmeans, codes, lengths, initial, iterations, bits)
    offsets, members = timer("group by cluster", ops.group_by_cluster, assignment, slots)

    # -- forward --
    centroids = timer("centroid mean", ops.cluster_mean, q, offsets, members)
    centroids = timer("centroid scale", torch.mul, centroids, scale)
    if topk is None:   # the fused kernel of CentroidValues (csrc/centroid_attention.cpp)
        centroid_values, logsumexp = timer("softmax(Q_c K^T) V", ops.centroid_attention, centroids, k, v, lengths)
        out = timer("broadcast", ops.cluster_broadcast, centroid_values, assignment)
        grad_values = timer("broadcast bwd", ops.cluster_broadcast_backward, grad_out, offsets, members)
        grad_centroids = timer("softmax(Q_c K^T) V bwd", ops.centroid_attention_backward, grad_values, centroids,
                               k, v, lengths, centroid_values, logsumexp)[0]
    else:   # ImprovedClusteredCPU: the fused centroid pass (T, m and V^b), then the fused top-key part
        bottom, mass, top, logsumexp = timer("top-k, m, V^b", ops.centroid_attention_top, centroids, k, v, lengths,
                                             topk)
        out, weights = timer("top-key attention", ops.clustered_top_attention, q, k, v, top, offsets, members,
                             mass, bottom, scale)
        # -- backward: the centroid pass adds its key and value gradients into the top-key part's --
        grad_q, grad_k, grad_v, grad_mass, grad_bottom = timer(
            "top-key attention bwd", ops.clustered_top_attention_backward, grad_out, q, k, v, top, offsets, members,
            mass, weights, scale)
        grad_centroids = timer("top-k, m, V^b bwd", ops.centroid_attention_top_backward, grad_bottom, grad_mass,
                               centroids, k, v, lengths, bottom, mass, top, logsumexp, grad_k, grad_v)
    grad_centroids = timer("centroid scale bwd", torch.mul, grad_centroids, scale)
    grad_rows = timer("centroid mean bwd", ops.cluster_mean_backward, grad_centroids, assignment, offsets)
    if topk is not None:
        timer("query gradient sum", grad_q.add_, grad_rows)
    return out


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python -m attention_ext.benchmarks.clustered_profile", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--attentions", nargs="+", default=["clustered", "iclustered"],
                        choices=["clustered", "iclustered"])
    parser.add_argument("--lengths", nargs="+", type=int, default=[4096, 32768])
    parser.add_argument("--clusters", type=int, default=100)
    parser.add_argument("--bits", type=int, default=63)
    parser.add_argument("--iterations", type=int, default=10)
    parser.add_argument("--topk", type=int, default=32)
    parser.add_argument("--heads", type=int, default=6)
    parser.add_argument("--dim", type=int, default=64)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--clock", choices=["wall", "cpu"], default="wall",
                        help="wall: wall-clock time; cpu: CPU time of this process, which other "
                             "processes on a busy machine do not inflate (use it with --threads 1: "
                             "with more threads it also counts the workers' waiting)")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    for name in args.attentions:
        results = {}
        for length in args.lengths:
            shape = (1, args.heads, length, args.dim)
            q, k, v, grad_out = (torch.randn(shape) for _ in range(4))
            timer = StageTimer(time.perf_counter if args.clock == "wall" else time.process_time)
            for repeat in range(args.repeats + 1):   # the first pass warms up
                timer.start_pass()
                with torch.no_grad():
                    clustered_pass(timer, q, k, v, grad_out, args.clusters, args.bits, args.iterations,
                                   args.topk if name == "iclustered" else None)
                if repeat:
                    timer.end_pass()
            results[length] = timer.medians()
        stages = list(results[args.lengths[0]])
        print(f"\n{name}-{args.clusters}: median ms over {args.repeats} passes, {args.threads} threads, "
              f"{args.clock} clock, batch 1, {args.heads} heads x {args.dim}, float32")
        print(f"{'stage':<28}" + "".join(f"{'N=' + str(n):>12}" for n in args.lengths))
        for stage in stages:
            print(f"{stage:<28}" + "".join(f"{results[n][stage]:>12.2f}" for n in args.lengths))
        totals = {n: sum(results[n].values()) for n in args.lengths}
        print(f"{'total':<28}" + "".join(f"{totals[n]:>12.2f}" for n in args.lengths))
        print(f"{'us/element':<28}" + "".join(f"{totals[n] * 1e3 / n:>12.3f}" for n in args.lengths))


if __name__ == "__main__":
    main()

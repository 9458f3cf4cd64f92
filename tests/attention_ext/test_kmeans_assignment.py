"""Hamming K-Means' assignment step with full 64-bit codes (the sign bit included) against a
brute-force nearest centroid. The kernel assigns the valid queries of a (batch, head) 16 codes
at a time and the rest one by one, and a thread's share of the positions may start anywhere,
so the lengths below end before, at and after multiples of 16, and both schedules (whole
heads per thread, positions shared out) run on one and on two threads."""
import pytest
import torch

from attention_ext._ops import ops


def popcount(x):
    return bin(x & (2**64 - 1)).count("1")


def nearest(code, centroids):
    return min(range(len(centroids)), key=lambda c: (popcount(code ^ centroids[c]), c))


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("batch,heads", [(1, 1), (4, 2)])
def test_assignment_is_the_nearest_centroid_with_ties_to_the_lowest_index(threads, batch, heads):
    generator = torch.Generator().manual_seed(batch * 10 + heads)
    length, clusters, bits = 600, 9, 64   # 600: two threads take 300 positions each
    codes = torch.randint(-2**63, 2**63 - 1, (batch, heads, length), generator=generator)
    codes[..., ::3] = codes[..., :1]           # many equal codes
    centroids = torch.randint(-2**63, 2**63 - 1, (batch, heads, clusters), generator=generator)
    centroids[..., 5] = centroids[..., 2]       # a duplicate centroid loses every tie
    centroids[..., 7] = codes[..., 0]           # distance 0 for a third of the codes
    lengths = torch.tensor([length, 37, 16, 15][:batch])
    previous = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        assignment, final = ops.hamming_kmeans(codes, lengths, centroids, 0, 63)
    finally:
        torch.set_num_threads(previous)
    assert torch.equal(final, centroids)       # no Lloyd step: only the final assignment
    for b in range(batch):
        valid = int(lengths[b])
        for h in range(heads):
            want = [nearest(x, centroids[b, h].tolist()) for x in codes[b, h, :valid].tolist()]
            assert assignment[b, h, :valid].tolist() == want
            assert torch.all(assignment[b, h, valid:] == -1)

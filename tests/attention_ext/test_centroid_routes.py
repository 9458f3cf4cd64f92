"""Clustered attention's centroid routes (fused kernel, unfused torch operators, SDPA with C queries)
give the same values and gradients, with padding and any lengths, and match the dense equations."""
import pytest
import torch

from attention_ext import build_attention
from attention_ext.attentions.clustered import centroid_route, centroid_routes, cluster_queries
from attention_ext.dispatch import RouteCall

from dense_clustered_attention import clustered_attention
from kernel_devices import DEVICES
from random_inputs import on, random_qkv

CASES = [  # (lengths, N, clusters): padded batches, a length 0 and 1, fewer queries than clusters
    ([40, 17, 0, 1], 40, 6),
    ([64, 64], 64, 8),
    ([9, 30], 30, 12),
]


def _routes(device: str) -> list[str | None]:
    """Every route that runs on `device`, and None: the dispatch's own choice."""
    return [r for r in centroid_routes.names if r != "fused" or device == "cpu"] + [None]


def _run(device, dtype, lengths, length, clusters, given_lengths=True):
    q, k, v = on(torch.device(device), *random_qkv((len(lengths), 2, length, 16), dtype=dtype, seed=length))
    for t in (q, k, v):
        t.requires_grad_(True)
    lengths = torch.tensor(lengths, device=device)
    torch.manual_seed(7)   # the same clusters on every route
    out = build_attention("clustered", clusters=clusters)(q, k, v, lengths if given_lengths else None)
    weights = torch.randn(out.shape, generator=torch.Generator().manual_seed(1), dtype=dtype).to(device)
    return (out, *torch.autograd.grad((out * weights).sum(), (q, k, v))), (q, k, v, lengths)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("lengths, length, clusters", CASES)
def test_every_route_gives_the_same_values_and_gradients(device, lengths, length, clusters):
    results = {}
    for chosen in _routes(device):
        with centroid_routes.forced(device, chosen):
            results[chosen], _ = _run(device, torch.float64, lengths, length, clusters)
    reference = results.pop("unfused")
    for chosen, got in results.items():
        for name, a, b in zip(("output", "dq", "dk", "dv"), got, reference):
            torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-12, msg=f"{chosen}: {name}")


@pytest.mark.parametrize("device", DEVICES)
def test_sdpa_route_matches_the_dense_equations(device):
    lengths, length, clusters = [40, 17, 0, 1], 40, 6
    with centroid_routes.forced(device, "sdpa"):
        (out, *_), (q, k, v, lengths_tensor) = _run(device, torch.float64, lengths, length, clusters)
    torch.manual_seed(7)   # the clustering the call drew
    assignment = cluster_queries(q.detach(), lengths_tensor, clusters, 63, 10).assignment
    expected = clustered_attention(q.detach().cpu(), k.detach().cpu(), v.detach().cpu(), lengths_tensor.cpu(),
                                   assignment.cpu(), clusters)
    torch.testing.assert_close(out.detach().cpu(), expected, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("device", DEVICES)
def test_sdpa_route_without_lengths_takes_no_mask(device):
    with centroid_routes.forced(device, "sdpa"):
        sdpa, _ = _run(device, torch.float64, [32, 32], 32, 5, given_lengths=False)
    with centroid_routes.forced(device, "unfused"):
        unfused, _ = _run(device, torch.float64, [32, 32], 32, 5, given_lengths=False)
    for a, b in zip(sdpa, unfused):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("device", DEVICES)
def test_float32_routes_agree_within_rounding(device):
    results = {}
    for chosen in _routes(device):
        with centroid_routes.forced(device, chosen):
            results[chosen], _ = _run(device, torch.float32, [40, 17, 0, 1], 40, 6)
    for chosen, got in results.items():
        for a, b in zip(got, results["unfused"]):
            torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)


def test_unknown_and_impossible_routes_are_refused():
    with pytest.raises(ValueError, match="choose one of fused, unfused, sdpa"):
        with centroid_routes.forced("cpu", "flash"):
            pass
    with pytest.raises(ValueError, match="CPU kernel"):
        with centroid_routes.forced("cuda", "fused"):
            pass
    assert centroid_routes.forced_route("cuda") is None   # a refused route leaves nothing forced


def test_forcing_is_scoped_and_nests():
    """A forced route holds inside its block only; an inner block's route gives way to the outer's."""
    assert centroid_routes.forced_route("cpu") is None
    with centroid_routes.forced("cpu", "sdpa"):
        assert centroid_route("cpu", torch.float32) == "sdpa"
        with centroid_routes.forced("cpu", "unfused"):
            assert centroid_route("cpu", torch.float32) == "unfused"
        with centroid_routes.forced("cpu", None):   # the dispatch's own choice inside
            assert centroid_route("cpu", torch.float32) == "fused"
        assert centroid_route("cpu", torch.float32) == "sdpa"
    assert centroid_routes.forced_route("cpu") is None
    with pytest.raises(KeyError):
        with centroid_routes.forced("cpu", "unfused"):
            raise KeyError("left by an error")
    assert centroid_routes.forced_route("cpu") is None


def test_dispatch_resolves_by_device_and_dtype():
    """The preferences chosen by measurement: on CUDA sdpa in half precision and unfused in float32;
    on the CPU the fused kernel (measured on AVX-512 and AVX2 alike); a forced route is taken as it is."""
    assert centroid_route("cuda", torch.bfloat16) == "sdpa"
    assert centroid_route("cuda", torch.float16) == "sdpa"
    assert centroid_route("cuda", torch.float32) == "unfused"
    assert centroid_route("cpu", torch.float32) == "fused"
    assert centroid_route("mps", torch.float32) == "unfused"
    with centroid_routes.forced("cpu", "unfused"), centroid_routes.forced("cuda", "unfused"):
        assert centroid_route("cpu", torch.float32) == "unfused"
        assert centroid_route("cuda", torch.bfloat16) == "unfused"
    reasons = centroid_routes.reasons(RouteCall("cuda", torch.float32))
    assert list(reasons) == ["unfused", "sdpa", "fused"]   # tried in order, the rest after
    assert reasons["fused"] == "the fused centroid route is a CPU kernel" and reasons["sdpa"] is None

"""The stage-by-stage profiler (python -m attention_ext.benchmarks.clustered_profile) times what the
attention modules compute: its forward output equals theirs for the same torch seed."""
import pytest
import torch

from attention_ext import build_attention
from attention_ext.benchmarks.clustered_profile import StageTimer, clustered_pass, main


@pytest.mark.parametrize("name, topk", [("clustered", None), ("iclustered", 8)])
def test_the_profiled_stages_compute_the_attention(name, topk):
    q, k, v, grad_out = (torch.randn(1, 2, 96, 16, generator=torch.Generator().manual_seed(i)) for i in range(4))
    options = dict(clusters=6, bits=31, iterations=5, **({"topk": topk} if topk else {}))
    torch.manual_seed(3)
    expected = build_attention(name, **options)(q, k, v, torch.tensor([96]))
    torch.manual_seed(3)
    timer = StageTimer()
    timer.start_pass()
    with torch.no_grad():
        out = clustered_pass(timer, q, k, v, grad_out, 6, 31, 5, topk)
    timer.end_pass()
    torch.testing.assert_close(out, expected)
    assert "kmeans" in timer.medians() and all(ms >= 0 for ms in timer.medians().values())


def test_the_command_prints_a_row_per_stage_and_a_total(capsys):
    main(["--attentions", "iclustered", "--lengths", "64", "--clusters", "4", "--heads", "1", "--dim", "8",
          "--repeats", "1", "--threads", "1", "--topk", "4"])
    lines = capsys.readouterr().out.splitlines()
    stages = [line.split()[0] for line in lines if line and not line.startswith(("iclustered", "stage"))]
    assert {"hash", "kmeans", "top-key", "total", "us/element"} <= set(stages)

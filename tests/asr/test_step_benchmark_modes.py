"""The step benchmark's modes (eager, compiled, graphed), devices and batch sizes. Not timed."""
import pytest
import torch

from asr.benchmarks.step import timing
from asr.benchmarks.step.__main__ import format_table, main
from asr.benchmarks.step.modes import apply_mode
from asr.benchmarks.step.workloads import MODELS, PLAIN, WORKLOADS, Workload, build_model, make_batch, with_batch_seconds

TINY = dict(layers=1, heads=2, head_dim=8, ff_dim=16, dropout=0.0, subsampling=2, subsampling_channels=4)


@pytest.fixture
def tiny(monkeypatch) -> Workload:
    monkeypatch.setitem(MODELS, "tiny", TINY)
    return Workload("tiny", "a test", "tiny", 12, ("phones",), 2, 0.3, {"phones": 10.0})


def test_graphed_steps_are_refused_off_the_gpu_with_the_reason(capsys):
    with pytest.raises(SystemExit) as exit_status:
        main(["--modes", "eager", "graphed", "--workloads", "synth-380"])
    assert exit_status.value.code == 2
    assert "--modes graphed replays CUDA graphs and needs --device cuda" in capsys.readouterr().err
    if not torch.cuda.is_available():
        with pytest.raises(SystemExit):
            main(["--device", "cuda"])
        assert "this torch sees no CUDA device" in capsys.readouterr().err


def test_batch_seconds_size_the_batch_by_audio():
    wsj = with_batch_seconds(WORKLOADS["wsj"], 2400)
    assert wsj.utterances == round(2400 / 7.8) and wsj.seconds == 7.8
    assert with_batch_seconds(WORKLOADS["wsj"], None) == WORKLOADS["wsj"]


def test_compiled_encoders_give_the_eager_loss(tiny):
    batch = make_batch(tiny, 0)
    for label in ("full", PLAIN):
        losses = []
        for mode in ("eager", "compiled"):
            torch.manual_seed(0)
            model = build_model(tiny, label)
            apply_mode(model, mode)
            losses.append(model.forward_loss(batch).item())
        assert losses[1] == pytest.approx(losses[0], rel=1e-4), label
    torch._dynamo.reset()


def test_a_model_that_fails_gets_its_error_in_the_table_and_the_others_go_on(tiny, monkeypatch):
    def failing_plain(model, mode, pool=None):
        if model.label == PLAIN:
            def step(batch):
                raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 40 GiB")
            model.step = step
    monkeypatch.setattr(timing, "apply_mode", failing_plain)
    results = timing.time_workload(tiny, ["full", PLAIN], repeats=2, warmup=1, precision="bf16-mixed")
    full, plain = results
    assert full.ok and len(full.seconds) == 2 and full.mode == "eager"
    assert not plain.ok and plain.error.startswith("OutOfMemoryError: CUDA out of memory")
    table = format_table(results)
    assert "OutOfMemoryError" in table and "| tiny     | eager | full " in table

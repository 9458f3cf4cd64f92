"""The GPU report's training-step parts read what asr.benchmarks.step writes: the table and the
issue's aims as checks, from step times whose answers are known."""
from asr.benchmarks.step.__main__ import write_csv
from asr.benchmarks.step.timing import StepTimes
from asr.benchmarks.step.workloads import WORKLOADS, with_batch_seconds
from attention_ext.gpu_report.training_steps import DEMO_AIM, csv_path, reader


def times(workload, label, mode, seconds, audio, error=None):
    return StepTimes(workload, label, 1000, audio, 390.0, [seconds] * 5, [seconds] * 5, mode=mode, error=error)


def test_the_wsj_ratios_are_checked_per_mode_and_a_failed_cell_is_a_failed_check(tmp_path):
    wsj = with_batch_seconds(WORKLOADS["wsj"], 2400)
    results = [times(wsj, "full", "eager", 0.104, 2400.0), times(wsj, "i-clustered-100", "eager", 0.13, 2400.0),
               times(wsj, "plain", "eager", 0.1, 2400.0),
               times(wsj, "full", "graphed", 0.2, 2400.0),
               times(wsj, "i-clustered-100", "graphed", 0.0, 2400.0, error="RuntimeError: capture failed"),
               times(wsj, "plain", "graphed", 0.1, 2400.0)]
    write_csv(results, csv_path(tmp_path, "steps_wsj"))
    checks, summary, files = reader("steps_wsj", demo_aim=False)("device: test\n", tmp_path)
    verdicts = {c.what: (c.ok, c.detail) for c in checks}
    assert verdicts["wsj eager: full's step <= 1.05x the plain SDPA model's"] == (True, "1.04x")
    assert verdicts["wsj eager: i-clustered-100's step <= 1.2x the plain SDPA model's"] == (False, "1.30x")
    assert verdicts["wsj graphed: full's step <= 1.05x the plain SDPA model's"] == (False, "2.00x")
    assert verdicts["wsj graphed i-clustered-100: 2400 s batches train"] == (False, "RuntimeError: capture failed")
    assert "| wsj | eager | full | 2400 | 104.0 | 1.04x | 23077 |" in summary
    assert files == ["csv/training_steps/steps_wsj.csv"]


def test_the_demo_aim_takes_the_best_mode_of_the_toolkit_model(tmp_path):
    demo = with_batch_seconds(WORKLOADS["synth-380"], 2400)
    results = [times(demo, "i-clustered-64", "eager", 2400 / 1000, 2400.0),
               times(demo, "i-clustered-64", "graphed", 2400 / 4000, 2400.0),
               times(demo, "plain", "eager", 0.5, 2400.0)]   # faster, but not the toolkit's
    write_csv(results, csv_path(tmp_path, "steps_demo"))
    checks, _, _ = reader("steps_demo", demo_aim=True)("", tmp_path)
    (aim,) = [c for c in checks if c.what.startswith("demo preset")]
    assert DEMO_AIM < 4000 and aim.ok and aim.detail.startswith("4000 h per GPU-hour") and aim.detail.endswith("graphed")

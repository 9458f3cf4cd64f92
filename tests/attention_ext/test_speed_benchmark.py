"""The benchmark entry point: peak-memory method, a tiny run's CSV/PNG, ratios and targets."""
import csv
import math
import re
import sys

import matplotlib.image
import pytest
import torch

from attention_ext import registry
from attention_ext.benchmarks import speed as benchmark
from attention_ext.benchmarks.speed import (CSV_COLUMNS, BenchmarkCase, Measurement, cpu_peak_memory_bytes,
                                     evaluate_targets)
from attention_ext.benchmarks.speed.__main__ import main
from attention_ext.registry import Option, register_attention

MIB = 2 ** 20
KIB = 2 ** 10
FLOAT = 4  # bytes


def test_cpu_peak_memory_of_known_allocations():
    def allocate():
        first = torch.empty(MIB)                # 4 MiB live
        del first                               # 0
        second = torch.empty(2 * MIB)           # 8
        third = torch.empty(MIB // 4)           # 9  <- peak
        del third                               # 8
        fourth = torch.empty(MIB // 8)          # 8.5
        return second, fourth

    assert cpu_peak_memory_bytes(allocate) == pytest.approx(9 * MIB, abs=4096)


def test_cpu_peak_memory_excludes_what_was_live_before_and_counts_backward():
    already_live = torch.empty(16 * MIB)  # noqa: F841  (64 MiB, must not be counted)
    assert cpu_peak_memory_bytes(lambda: torch.empty(MIB // 4)) == pytest.approx(MIB, abs=4096)

    x = torch.randn(MIB, requires_grad=True)
    grad = torch.randn(MIB)

    def forward_backward():
        y = x * 3          # 4 MiB output, alive during backward
        y.backward(grad)   # x.grad = grad * 3: another 4 MiB

    assert cpu_peak_memory_bytes(forward_backward) == pytest.approx(8 * MIB, abs=4096)


def test_cpu_peak_memory_sees_allocations_inside_a_compiled_operator():
    a = torch.randn(512, 256)
    b = torch.randn(256, 1024)
    # matmul's output is allocated in C++ (512 x 1024 floats = 2 MiB).
    assert cpu_peak_memory_bytes(lambda: a @ b) == pytest.approx(2 * MIB, abs=4096)


SCRATCH_BYTES = 8 * MIB


class ScratchAttention(torch.nn.Module):
    """out = 2 v, plus an 8 MiB scratch buffer allocated and freed while out is live.

    Its forward+backward peak is therefore exactly |out| + 8 MiB (backward only
    allocates grad_v = 2 grad, |out| bytes, after the scratch is gone).
    """

    def forward(self, q, k, v, lengths=None):
        out = v * 2.0
        scratch = torch.empty(SCRATCH_BYTES // FLOAT)
        scratch.fill_(0.0)
        del scratch
        return out


class SharedKeyProbe(torch.nn.Module):
    """Records whether it was called with k = q, as lsh must be."""
    calls_with_shared_qk: list = []

    def __init__(self, rounds, chunk_size):
        super().__init__()

    def forward(self, q, k, v, lengths=None):
        SharedKeyProbe.calls_with_shared_qk.append(k is q)
        return v * 1.0 + q.sum() * 0.0


class RunsOutOfMemory(torch.nn.Module):
    """Plain attention (out = v) below N = 128; from 128 on, the allocator refuses."""

    def forward(self, q, k, v, lengths=None):
        if q.shape[2] >= 128:
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 64.00 GiB")
        return v * 1.0


class Broken(torch.nn.Module):
    def forward(self, q, k, v, lengths=None):
        raise ValueError("a bug in the attention")


@pytest.fixture
def test_registry(monkeypatch):
    """The real full attention plus two test attentions, in a registry restored afterwards."""
    monkeypatch.setattr(registry, "_REGISTRY", {"full": registry.available_attentions()["full"]})
    register_attention("scratch_test")(ScratchAttention)
    register_attention("oom_test")(RunsOutOfMemory)
    register_attention("broken_test")(Broken)
    register_attention("lsh", (Option("rounds", 1, 1), Option("chunk_size", 32, 1)),
                       needs_shared_qk=True, number_option="rounds")(SharedKeyProbe)
    SharedKeyProbe.calls_with_shared_qk.clear()
    threads = torch.get_num_threads()
    yield
    torch.set_num_threads(threads)


def read_rows(path):
    with open(path, newline="") as handle:
        reader = csv.DictReader(handle)
        return reader.fieldnames, list(reader)


def test_tiny_benchmark_writes_csv_png_ratios_and_memory(test_registry, tmp_path, capsys):
    batch, heads, dim = 1, 2, 16
    main(["--lengths", "64", "128", "--attentions", "full", "scratch-test", "lsh-2",
          "--repeats", "1", "--warmup", "1", "--batch", str(batch), "--heads", str(heads),
          "--dim", str(dim), "--threads", "1", "--out", str(tmp_path)])
    stdout = capsys.readouterr().out

    columns, rows = read_rows(tmp_path / "benchmark_cpu.csv")
    assert tuple(columns) == CSV_COLUMNS
    assert [(row["length"], row["attention"]) for row in rows] == [
        ("64", "full"), ("64", "scratch-test"), ("64", "lsh-2"),
        ("128", "full"), ("128", "scratch-test"), ("128", "lsh-2")]
    assert all(row["status"] == "ok" and row["repeats"] == "1" for row in rows)
    assert [row["options"] for row in rows[:3]] == ["", "", "rounds=2 chunk_size=32"]

    full = {row["length"]: row for row in rows if row["name"] == "full"}
    for row in rows:
        length, median = int(row["length"]), float(row["median_ms"])
        reference = full[row["length"]]
        expected_speedup = float(reference["median_ms"]) / median
        assert float(row["speedup_vs_full"]) == pytest.approx(expected_speedup, rel=1e-4)
        peak_bytes = int(row["peak_memory_bytes"])
        expected_saving = int(reference["peak_memory_bytes"]) / peak_bytes
        assert float(row["memory_saving_vs_full"]) == pytest.approx(expected_saving, rel=1e-4)
        assert float(row["peak_memory_mib"]) == pytest.approx(peak_bytes / MIB, rel=1e-4)
        assert float(row["time_per_element_us"]) == pytest.approx(
            median * 1e3 / (batch * length), rel=1e-4)
        assert float(row["memory_per_element_kib"]) == pytest.approx(
            peak_bytes / 1024 / (batch * length), rel=1e-4)
        if row["name"] == "scratch_test":
            out_bytes = batch * heads * length * dim * FLOAT
            assert peak_bytes == pytest.approx(out_bytes + SCRATCH_BYTES, abs=4096)

    # lsh is called with k = q: 2 lengths x (1 warm-up + 1 repeat + 1 memory pass).
    assert SharedKeyProbe.calls_with_shared_qk == [True] * 6

    image = matplotlib.image.imread(tmp_path / "benchmark_cpu.png")
    assert image.ndim == 3 and image.shape[0] > 200 and image.shape[1] > 400

    assert "lsh-2 = lsh(rounds=2 chunk_size=32)  [k = q]" in stdout
    assert "speedup vs full" in stdout and "none apply" in stdout


def test_max_length_skips_an_attention_and_leaves_its_ratio_empty(test_registry, tmp_path, capsys):
    main(["--lengths", "32,64", "--attentions", "full,scratch-test", "--repeats", "1",
          "--warmup", "0", "--heads", "1", "--dim", "8", "--max-length", "full=32",
          "--out", str(tmp_path)])
    _, rows = read_rows(tmp_path / "benchmark_cpu.csv")
    by_key = {(row["length"], row["attention"]): row for row in rows}
    assert by_key[("64", "full")]["status"] == "skipped (--max-length 32)"
    assert by_key[("64", "full")]["median_ms"] == ""
    assert by_key[("64", "scratch-test")]["status"] == "ok"
    assert by_key[("64", "scratch-test")]["speedup_vs_full"] == ""
    assert by_key[("32", "scratch-test")]["speedup_vs_full"] != ""


@pytest.mark.parametrize("argv,message", [
    (["--attentions", "nonsense"], "unknown attention spec 'nonsense'"),
    (["--attentions", "full", "full"], "listed twice"),
    (["--attentions", "full", "--max-length", "lsh=10"], "'lsh' is none of the benchmarked attentions"),
    (["--max-length", "full:10"], "expected SPEC=N"),
    (["--lengths", "abc"], "'abc' is not an integer"),
    (["--device", "tpu"], "--device 'tpu'"),
    (["--shapes", "tiny"], "--shapes: 'tiny' is not a table; choose among paper, asr"),
])
def test_bad_arguments_name_the_value(test_registry, tmp_path, capsys, argv, message):
    with pytest.raises(SystemExit) as exit:
        main(argv + ["--out", str(tmp_path)])
    assert exit.value.code == 2   # README's convention: a usage error
    assert message in capsys.readouterr().err


def test_ctrl_c_exits_130_without_a_traceback(monkeypatch, capsys):
    from attention_ext.benchmarks.speed import __main__ as command_line

    def interrupted(argv=None):
        raise KeyboardInterrupt
    monkeypatch.setattr(command_line, "main", interrupted)
    assert command_line.command([]) == 130
    assert capsys.readouterr().err.strip() == "attention_ext.benchmarks.speed: interrupted; nothing was written"


def test_asr_table_runs_on_the_cpu_at_a_tiny_size(test_registry, tmp_path, capsys):
    batch, heads, dim = 2, 1, 8
    main(["--shapes", "asr", "--batch", str(batch), "--heads", str(heads), "--dim", str(dim),
          "--lengths", "16", "32", "--attentions", "full", "scratch-test", "--repeats", "1",
          "--warmup", "0", "--threads", "1", "--out", str(tmp_path)])
    stdout = capsys.readouterr().out
    assert not (tmp_path / "benchmark_cpu.csv").exists()   # the paper table was not asked for
    columns, rows = read_rows(tmp_path / "benchmark_cpu_asr.csv")
    assert tuple(columns) == CSV_COLUMNS
    assert [(row["length"], row["attention"], row["batch"], row["heads"], row["dim"], row["status"])
            for row in rows] == [
        (str(length), label, str(batch), str(heads), str(dim), "ok")
        for length in (16, 32) for label in ("full", "scratch-test")]
    for row in rows:
        length, median = int(row["length"]), float(row["median_ms"])
        assert float(row["time_per_element_us"]) == pytest.approx(median * 1e3 / (batch * length), rel=1e-4)
        if row["name"] == "scratch_test":   # the batch's output + the 8 MiB scratch
            assert int(row["peak_memory_bytes"]) == pytest.approx(
                batch * heads * length * dim * FLOAT + SCRATCH_BYTES, abs=4096)
    assert "== ASR shapes: a training batch of 32 utterances ==" in stdout
    assert f"batch {batch}, {heads} heads, dim {dim}" in stdout
    assert "targets: none for the asr table" in stdout
    assert (tmp_path / "benchmark_cpu_asr.png").exists()


def test_tables_have_their_own_shapes_unless_overridden():
    from attention_ext.benchmarks.speed.__main__ import build_parser, config_from_args
    from attention_ext.benchmarks.speed.cases import default_shapes

    def configs(argv):
        parser = build_parser()
        return config_from_args(parser.parse_args(argv), parser)

    [paper] = configs([])
    assert (paper.shape, paper.batch, paper.heads, paper.dim, paper.lengths) == (
        "paper", 1, 6, 64, [512, 1024, 2048, 4096, 8192])
    paper, asr = configs(["--shapes", "paper", "asr"])
    assert (asr.shape, asr.batch, asr.heads, asr.dim, asr.lengths) == ("asr", 32, 4, 64, [256, 512, 1024, 2048])
    assert paper.batch == 1
    paper, asr = configs(["--shapes", "paper,asr", "--batch", "3", "--lengths", "64"])
    assert (paper.batch, paper.lengths, asr.batch, asr.lengths, asr.heads) == (3, [64], 3, [64], 4)
    assert default_shapes("cuda") == ("paper", "asr") and default_shapes("cpu") == ("paper",)


def fake_case(label, name, **options):
    return BenchmarkCase(label, name, options, torch.nn.Identity(), shared_qk=False)


def cells(case, times_by_length, peak_bytes_by_length=None):
    peaks = peak_bytes_by_length or {}
    return [Measurement(length, case, times_ms=[time_ms], peak_bytes=peaks.get(length))
            for length, time_ms in times_by_length.items()]


def test_targets_pass_fail_on_measured_ratios_only():
    full = fake_case("full", "full")
    clustered = fake_case("clustered-100", "clustered", clusters=100)
    lsh4 = fake_case("lsh-4", "lsh", rounds=4, chunk_size=32)
    measurements = (
        cells(full, {4096: 400.0, 16384: 6400.0, 32768: 25600.0})
        # 400/10 = 40x >= 30 at 4096; per element (ms/N): 10/4096, 40/16384, 160/32768 ->
        # spread 2.0 > 1.3.
        + cells(clustered, {4096: 10.0, 16384: 40.0, 32768: 320.0})
        # 400/200 = 2x < 3 at 4096; per element 1.4x apart (within lsh-4's 1.5x); memory per
        # element 4 KiB at 4096 and 6 KiB at 32768: 1.5x apart, more than 1.3x.
        + cells(lsh4, {4096: 200.0, 16384: 800.0, 32768: 2240.0},
                {4096: 4096 * 4 * KIB, 16384: 16384 * 5 * KIB, 32768: 32768 * 6 * KIB}))
    benchmark.add_ratios_to_full(measurements)
    results = {result.text.split(" (target")[0]: result
               for result in evaluate_targets(measurements, 1, "cpu", torch.float32)}
    assert set(results) == {
        "clustered-100: speedup vs full at N=4096 >= 30x",
        "clustered-100: time per element within 1.3x over N=4096..32768",
        "lsh-4: speedup vs full at N=4096 >= 3x",
        "lsh-4: time per element within 1.5x over N=4096..32768",
        "lsh-4: memory per element within 1.3x over N=4096..32768",
    }  # no lsh-1 or iclustered target: those were not measured; clustered has no memory target
    assert results["clustered-100: speedup vs full at N=4096 >= 30x"].passed
    assert "40.00x" in results["clustered-100: speedup vs full at N=4096 >= 30x"].text
    assert not results["clustered-100: time per element within 1.3x over N=4096..32768"].passed
    assert "max/min = 4.00" in results["clustered-100: time per element within 1.3x over N=4096..32768"].text
    assert not results["lsh-4: speedup vs full at N=4096 >= 3x"].passed
    assert results["lsh-4: time per element within 1.5x over N=4096..32768"].passed
    assert "max/min = 1.40" in results["lsh-4: time per element within 1.5x over N=4096..32768"].text
    memory = results["lsh-4: memory per element within 1.3x over N=4096..32768"]
    assert not memory.passed
    assert "max/min = 1.50 (N=4096: 4 KiB, N=16384: 5 KiB, N=32768: 6 KiB)" in memory.text

    # On the GPU (bfloat16) LSH's memory per element must stay flat up to N=65536.
    gpu = (cells(full, {4096: 1.0, 65536: 200.0})
           + cells(lsh4, {4096: 2.0, 65536: 40.0}, {4096: 4096 * 4 * KIB, 65536: 65536 * 5 * KIB}))
    benchmark.add_ratios_to_full(gpu)
    [result] = [result for result in evaluate_targets(gpu, 1, "cuda", torch.bfloat16)
                if "memory" in result.text]
    assert result.passed and result.text.startswith(
        "lsh-4: memory per element within 1.3x over N=4096..65536 (target for lsh-4): max/min = 1.25")


def test_targets_need_full_at_the_same_length():
    clustered = fake_case("clustered-100", "clustered", clusters=100)
    measurements = cells(fake_case("full", "full"), {2048: 10.0}) + cells(clustered, {4096: 1.0})
    benchmark.add_ratios_to_full(measurements)
    assert evaluate_targets(measurements, 1, "cpu", torch.float32) == []
    assert math.isclose(measurements[0].time_per_element_us(1), 10.0 * 1e3 / 2048)


def test_overtaking_length_is_where_an_attention_stays_faster_than_full():
    full = fake_case("full", "full")
    clustered = fake_case("clustered-100", "clustered", clusters=100)
    iclustered = fake_case("i-clustered-100", "iclustered", clusters=100, topk=32)
    lsh4 = fake_case("lsh-4", "lsh", rounds=4, chunk_size=32)
    measurements = (
        cells(full, {1024: 1.0, 2048: 2.0, 4096: 4.0, 8192: 8.0, 16384: 16.0})
        # faster at 1024, slower at 2048, faster from 4096 on: it overtakes for good at 4096
        + cells(clustered, {1024: 0.5, 2048: 3.0, 4096: 3.0, 8192: 4.0, 16384: 5.0})
        # slower up to 8192, faster (by 16/12) only at 16384
        + cells(iclustered, {1024: 9.0, 2048: 9.0, 4096: 9.0, 8192: 10.0, 16384: 12.0})
        # equal to full at the longest N: never strictly faster there
        + cells(lsh4, {8192: 7.0, 16384: 16.0}))
    benchmark.add_ratios_to_full(measurements)
    assert benchmark.overtaking_lengths(measurements) == {
        "clustered-100": 4096, "i-clustered-100": 16384, "lsh-4": None}
    text = benchmark.format_overtaking(benchmark.overtaking_lengths(measurements))
    assert "clustered-100: from N=4096" in text and "lsh-4: not faster at the longest N measured" in text

    # the GPU aims (bfloat16 on cuda): clustered by N=8192 (met), i-clustered by N=16384 (met)
    results = evaluate_targets(measurements, 1, "cuda", torch.bfloat16)
    assert [(result.passed, result.text) for result in results] == [
        (True, "clustered-100: overtakes full at N <= 8192 (target for clustered): from N=4096, 2.00x at N=8192"),
        (True, "i-clustered-100: overtakes full at N <= 16384 (target for iclustered): "
               "from N=16384, 1.33x at N=16384")]
    # the CPU targets do not apply to a GPU run, nor the GPU aims to another dtype
    assert evaluate_targets(measurements, 1, "cuda", torch.float32) == []
    assert all("overtakes" not in result.text
               for result in evaluate_targets(measurements, 1, "cpu", torch.float32))


def test_overtaking_target_fails_when_full_is_still_faster_at_its_length():
    full, clustered = fake_case("full", "full"), fake_case("clustered-100", "clustered", clusters=100)
    measurements = cells(full, {8192: 8.0, 16384: 16.0}) + cells(clustered, {8192: 9.0, 16384: 10.0})
    benchmark.add_ratios_to_full(measurements)
    [result] = evaluate_targets(measurements, 1, "cuda", torch.bfloat16)
    assert not result.passed and "from N=16384, 0.89x at N=8192" in result.text


def test_out_of_memory_retires_an_attention_for_longer_sequences(test_registry, tmp_path, capsys):
    main(["--lengths", "64", "128", "256", "--attentions", "full", "oom-test",
          "--repeats", "1", "--heads", "1", "--dim", "8", "--out", str(tmp_path)])
    _, rows = read_rows(tmp_path / "benchmark_cpu.csv")
    status = {row["length"]: row["status"] for row in rows if row["name"] == "oom_test"}
    assert status == {"64": "ok", "128": "out of memory",
                      "256": "skipped (out of memory at N=128)"}
    assert all(row["status"] == "ok" for row in rows if row["name"] == "full")
    assert "out of memory" in capsys.readouterr().out


def test_an_attention_bug_is_raised_with_the_attention_and_length(test_registry, tmp_path):
    with pytest.raises(ValueError, match="a bug in the attention") as error:
        main(["--lengths", "16", "--attentions", "full", "broken-test", "--repeats", "1",
              "--heads", "1", "--dim", "8", "--out", str(tmp_path)])
    if sys.version_info >= (3, 11):  # exception notes
        assert "while benchmarking broken-test = broken_test() at N=16" in error.value.__notes__


# ---- the long table: forward passes, the time budget, the forced SDPA kernel, its targets ----

class GradModeProbe(torch.nn.Module):
    """out = 2 v; records, per call, whether autograd was recording (False in a forward-only pass)."""
    grad_enabled: list = []

    def forward(self, q, k, v, lengths=None):
        GradModeProbe.grad_enabled.append(torch.is_grad_enabled())
        return v * 2.0


class QuadraticSleeper(torch.nn.Module):
    """out = v after sleeping 4 N^2 microseconds: 16 ms at N=64, 66 ms at 128, 262 ms at 256."""

    def forward(self, q, k, v, lengths=None):
        import time
        time.sleep(q.shape[2] ** 2 * 4e-6)
        return v * 1.0


REAL_LINEAR = registry.available_attentions()["linear"]   # before test_registry replaces the registry


@pytest.fixture
def long_registry(test_registry):
    """test_registry plus the two probes above and the real linear attention (a long target's)."""
    registry._REGISTRY["linear"] = REAL_LINEAR
    register_attention("grad_mode_probe")(GradModeProbe)
    register_attention("quadratic_sleeper")(QuadraticSleeper)
    GradModeProbe.grad_enabled.clear()
    yield


def test_long_table_defaults_are_the_demo_models_attention_and_both_passes():
    from attention_ext.benchmarks.speed.__main__ import build_parser, config_from_args

    def configs(argv):
        parser = build_parser()
        return config_from_args(parser.parse_args(argv), parser)

    forward, both = configs(["--shapes", "long"])
    for config in (forward, both):
        assert (config.shape, config.batch, config.heads, config.dim, config.lengths) == (
            "long", 1, 4, 32, [16384, 65536, 262144])
        assert (config.time_budget_s, config.full_backend) == (120.0, "flash")
    assert (forward.backward, both.backward) == (False, True)
    assert (forward.pass_name, both.pass_name) == ("forward", "forward+backward")
    [only] = configs(["--shapes", "long", "--passes", "forward+backward", "--time-budget", "none",
                      "--full-backend", "auto", "--lengths", "256", "1024"])
    assert (only.backward, only.time_budget_s, only.full_backend, only.lengths) == (True, None, "auto", [256, 1024])
    [paper] = configs([])   # the other tables as before
    assert (paper.backward, paper.time_budget_s, paper.full_backend) == (True, None, "auto")


def test_forward_pass_runs_without_autograd_and_is_written_to_its_own_files(long_registry, tmp_path, capsys):
    main(["--shapes", "long", "--lengths", "64", "128", "--attentions", "full", "grad-mode-probe", "linear",
          "--repeats", "1", "--warmup", "0", "--threads", "1", "--time-budget", "none", "--out", str(tmp_path)])
    stdout = capsys.readouterr().out
    # forward table first (2 lengths x (1 repeat + 1 memory pass)), then forward+backward's
    assert GradModeProbe.grad_enabled == [False] * 4 + [True] * 4
    _, forward_rows = read_rows(tmp_path / "benchmark_cpu_long_forward.csv")
    _, both_rows = read_rows(tmp_path / "benchmark_cpu_long.csv")
    assert {row["pass"] for row in forward_rows} == {"forward"}
    assert {row["pass"] for row in both_rows} == {"forward+backward"}
    assert all(row["status"] == "ok" and (row["heads"], row["dim"]) == ("4", "32") for row in forward_rows + both_rows)
    # the probe's forward keeps out = 2v alone; forward+backward adds grad_v of the same size
    out_bytes = {length: 4 * length * 32 * FLOAT for length in (64, 128)}
    for rows, expected in ((forward_rows, out_bytes), (both_rows, {n: 2 * b for n, b in out_bytes.items()})):
        for row in rows:
            if row["name"] == "grad_mode_probe":
                assert int(row["peak_memory_bytes"]) == pytest.approx(expected[int(row["length"])], abs=4096)
    assert (tmp_path / "benchmark_cpu_long_forward.png").exists() and (tmp_path / "benchmark_cpu_long.png").exists()
    assert "== long sequences" in stdout and ", forward ==" in stdout and ", forward+backward ==" in stdout
    assert "full = full()  [SDPA kernel flash]" in stdout
    assert "linear: time per element within 1.5x over N=64..128 (target for linear)" in stdout


def test_estimated_pass_seconds_scales_the_longest_shorter_length_quadratically():
    from attention_ext.benchmarks.speed import estimated_pass_seconds
    assert estimated_pass_seconds({}, 1024) is None
    assert estimated_pass_seconds({2048: 1.0}, 1024) is None          # only longer lengths measured
    assert estimated_pass_seconds({256: 0.5, 512: 1.0}, 2048) == (16.0, 512)
    assert estimated_pass_seconds({256: 0.5, 512: 1.0, 4096: 9.0}, 1024) == (4.0, 512)


def test_time_budget_skips_what_would_take_too_long_and_says_why(long_registry, tmp_path, capsys):
    # 16, 66 and 262 ms per pass at N = 64, 128, 256; budget 150 ms: 128 is estimated at ~66 ms
    # (16 ms x 2^2) and runs, 256 at ~262 ms (66 ms x 2^2) and is skipped; full is far below it.
    main(["--shapes", "long", "--passes", "forward", "--lengths", "64", "128", "256", "--attentions", "full",
          "quadratic-sleeper", "--repeats", "1", "--warmup", "1", "--threads", "1", "--time-budget", "0.15",
          "--out", str(tmp_path)])
    captured = capsys.readouterr()
    _, rows = read_rows(tmp_path / "benchmark_cpu_long_forward.csv")
    status = {(row["attention"], row["length"]): row["status"] for row in rows}
    assert status[("quadratic-sleeper", "64")] == status[("quadratic-sleeper", "128")] == "ok"
    skipped = status[("quadratic-sleeper", "256")]
    match = re.fullmatch(r"skipped \(estimated ([0-9.]+) s per pass > time budget 0.15 s: ([0-9.]+) s at "
                         r"N=128 x \(N/128\)\^2\)", skipped)
    assert match and float(match[1]) == pytest.approx(4 * float(match[2]), rel=0.01)
    assert float(match[2]) == pytest.approx(0.0655, abs=0.03)
    assert all(status[("full", length)] == "ok" for length in ("64", "128", "256"))
    assert "time budget 0.15 s per pass" in captured.out and skipped in captured.out
    assert "N=   256 quadratic-sleeper: skipped (estimated" in captured.err
    # no target for the sleeper: only clustered, i-clustered, lsh and linear have long targets
    assert "quadratic-sleeper: time per element" not in captured.out


def test_a_forced_sdpa_kernel_is_used_and_one_torch_lacks_is_a_usage_error(test_registry, tmp_path, capsys):
    # math materialises the (N, N) weights of every head, FlashAttention does not: the forward's peak
    # tells which kernel ran.
    length, heads = 512, 2
    weights_bytes = heads * length * length * FLOAT
    peaks = {}
    for backend in ("math", "flash"):
        main(["--shapes", "long", "--passes", "forward", "--lengths", str(length), "--heads", str(heads),
              "--attentions", "full", "--full-backend", backend, "--repeats", "1", "--warmup", "0",
              "--threads", "1", "--out", str(tmp_path / backend)])
        _, [row] = read_rows(tmp_path / backend / "benchmark_cpu_long_forward.csv")
        peaks[backend] = int(row["peak_memory_bytes"])
    assert peaks["math"] >= weights_bytes > 4 * peaks["flash"]
    capsys.readouterr()
    with pytest.raises(SystemExit) as exit:
        main(["--shapes", "long", "--attentions", "full", "--full-backend", "efficient", "--out", str(tmp_path)])
    assert exit.value.code == 2
    assert "--full-backend efficient: torch's SDPA has no such kernel for torch.float32 on cpu" in capsys.readouterr().err


@pytest.mark.parametrize("argv,message", [
    (["--time-budget", "0"], "give seconds > 0, or none"),
    (["--time-budget", "soon"], "'soon' is neither a number of seconds nor none"),
    (["--passes", "backward"], "invalid choice: 'backward'"),
])
def test_bad_long_options_name_the_value(test_registry, tmp_path, capsys, argv, message):
    with pytest.raises(SystemExit) as exit:
        main(argv + ["--out", str(tmp_path)])
    assert exit.value.code == 2 and message in capsys.readouterr().err


def test_long_targets_on_hand_made_rows():
    from attention_ext.benchmarks.speed import evaluate_long_targets
    lengths = [256, 1024, 4096]   # standing in for 16,384, 65,536 and 262,144
    clustered = fake_case("clustered-100", "clustered", clusters=100)
    iclustered = fake_case("i-clustered-64", "iclustered", clusters=64, topk=32)
    lsh = fake_case("lsh-4", "lsh", rounds=4, chunk_size=32)
    linear = fake_case("linear", "linear")
    other = fake_case("agglomerative-8", "agglomerative", classes=8)
    full = fake_case("full", "full")

    def linear_bytes(per_element_kib):
        return {n: int(n * per_element_kib * KIB) for n in lengths}

    measurements = (
        # time per element 1.0, 1.2, 1.4 us (ms = us * N / 1000): 1.4x, within 1.5x; memory 4 KiB flat
        cells(clustered, {256: 0.256, 1024: 1.2288, 4096: 5.7344}, linear_bytes(4))
        # time 1, 1, 2 us per element: 2x, fails; memory 4, 5, 6 KiB per element: 1.5x, fails
        + cells(iclustered, {256: 0.256, 1024: 1.024, 4096: 8.192},
                {256: 256 * 4 * KIB, 1024: 1024 * 5 * KIB, 4096: 4096 * 6 * KIB})
        # lsh: measured at 256 and 1024, skipped at 4096 (what the budget writes)
        + cells(lsh, {256: 1.0, 1024: 4.0}, linear_bytes(2))
        + cells(linear, {256: 0.5, 1024: 2.0, 4096: 8.0}, linear_bytes(3))
        + cells(other, {256: 1.0, 1024: 100.0, 4096: 9000.0}, linear_bytes(1))
        + cells(full, {256: 1.0, 1024: 16.0}, linear_bytes(1)))
    measurements.append(Measurement(4096, lsh, status="skipped (estimated 999 s per pass > time budget 120 s: ...)"))
    results = {result.text.split(" (target")[0]: result
               for result in evaluate_long_targets(measurements, 1, "cpu", lengths)}
    assert set(results) == {f"{label}: {quantity} per element within {factor}x over N=256..4096"
                            for label in ("clustered-100", "i-clustered-64", "lsh-4", "linear")
                            for quantity, factor in (("time", "1.5"), ("memory", "1.3"))}
    assert [label for label, result in results.items() if result.passed] == [
        "clustered-100: time per element within 1.5x over N=256..4096",
        "linear: time per element within 1.5x over N=256..4096",
        "clustered-100: memory per element within 1.3x over N=256..4096",
        "linear: memory per element within 1.3x over N=256..4096"]
    assert "max/min = 1.40 (N=256: 1 us, N=1024: 1.2 us, N=4096: 1.4 us)" in results[
        "clustered-100: time per element within 1.5x over N=256..4096"].text
    assert "max/min = 2.00" in results["i-clustered-64: time per element within 1.5x over N=256..4096"].text
    assert "max/min = 1.50 (N=256: 4 KiB, N=1024: 5 KiB, N=4096: 6 KiB)" in results[
        "i-clustered-64: memory per element within 1.3x over N=256..4096"].text
    lsh_time = results["lsh-4: time per element within 1.5x over N=256..4096"].text
    assert "not measured at every length (N=4096: skipped (estimated 999 s per pass" in lsh_time

    # On CUDA only the memory targets (a GPU pass at the shortest N is launch-bound).
    on_cuda = evaluate_long_targets(measurements, 1, "cuda", lengths)
    assert len(on_cuda) == 4 and all(" memory per element " in result.text for result in on_cuda)
    # batch divides per element: two sequences of the same cells halve every value, not the spread
    halved = evaluate_long_targets(measurements, 2, "cpu", lengths)
    assert [result.passed for result in halved] == [result.passed for result in results.values()]


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_long_table_on_cuda_with_flash_attention(tmp_path, capsys):
    """The long table as the GPU report's long_n part runs it (bfloat16, full through FlashAttention),
    at short lengths: every cell measured, and the memory targets (the only ones on CUDA) evaluated."""
    main(["--device", "cuda", "--dtype", "bfloat16", "--shapes", "long", "--full-backend", "flash",
          "--lengths", "1024", "4096", "--attentions", "full", "clustered-100", "lsh-1", "linear",
          "--repeats", "1", "--warmup", "0", "--out", str(tmp_path)])
    stdout = capsys.readouterr().out
    for name in ("benchmark_cuda_long.csv", "benchmark_cuda_long_forward.csv"):
        _, rows = read_rows(tmp_path / name)
        assert all(row["status"] == "ok" and row["dtype"] == "bfloat16" for row in rows)
        assert all(int(row["peak_memory_bytes"]) > 0 for row in rows)
    assert "full = full()  [SDPA kernel flash]" in stdout
    assert "time per element within" not in stdout
    assert stdout.count("memory per element within 1.3x over N=1024..4096") == 2 * 3   # 2 passes, 3 attentions

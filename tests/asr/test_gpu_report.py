"""The GPU report's pieces that run without a GPU: the part list, reading each part's output,
the resume logic, the report, and the one-line exit without CUDA."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from asr.benchmarks.gpu_report import __main__ as gpu_report
from asr.benchmarks.gpu_report.checks import Check
from asr.benchmarks.gpu_report.parts import (PARTS, Part, PartResult, read_benchmark, read_json_part, read_lsh_memory,
                                            read_pytest, read_training)
from asr.benchmarks.gpu_report.report import format_report, load_result, run_parts, save_result

ROOT = Path(__file__).resolve().parents[2]


def test_the_parts_fit_in_ten_minutes_and_cover_the_issue(tmp_path):
    assert sum(p.budget_seconds for p in PARTS if p.default) <= 600
    names = [p.name for p in PARTS]
    assert len(set(names)) == len(names)
    assert {"cuda_tests", "benchmark_bfloat16", "benchmark_float32", "lsh_memory", "profiles",
            "centroid_routes", "training_eager", "training_graphed", "steps_demo", "steps_wsj",
            "training_compiled", "long_n"} == set(names)
    assert [p.name for p in PARTS if not p.default] == ["training_compiled", "long_n"]
    for part in PARTS:
        command = part.command(tmp_path)
        assert command[0] == sys.executable and all(isinstance(a, str) for a in command)
    training = {p.name: " ".join(p.command(tmp_path)) for p in PARTS if p.name.startswith("training")}
    assert "--compile true --graphs false" in training["training_compiled"]
    assert "--compile false --graphs true" in training["training_graphed"]
    assert "--compile false --graphs false" in training["training_eager"]
    steps = {p.name: " ".join(p.command(tmp_path)) for p in PARTS if p.name.startswith("steps")}
    for name, command in steps.items():
        assert "-m asr.benchmarks.step --device cuda --precision bf16-mixed --modes eager graphed compiled" in command
        assert "--batch-seconds 2400" in command
    assert "--workloads synth-380 --models i-clustered-64 plain" in steps["steps_demo"]
    assert "--workloads wsj --models full i-clustered-100 plain" in steps["steps_wsj"]


def test_read_pytest_counts_and_lists_failures(tmp_path):
    log = "....F.\nFAILED tests/attention_ext/test_lsh.py::test_x[cuda] - AssertionError\n1 failed, 5 passed, 3 skipped in 9.1s\n"
    (check,), summary, _ = read_pytest(log, tmp_path)
    assert not check.ok and "5 passed, 1 failed" in check.detail
    assert "test_lsh.py::test_x[cuda]" in summary
    (check,), _, _ = read_pytest("12 passed, 600 deselected in 3.0s\n", tmp_path)
    assert check.ok
    (check,), _, _ = read_pytest("no tests ran in 0.1s\n", tmp_path)
    assert not check.ok


def test_read_pytest_says_how_far_a_run_stopped_before_its_summary_got(tmp_path):
    # the H200 run's cuda_tests log: its budget ended the run before pytest's summary line
    log = ".........................sssssssssssss....................\n"
    (check,), summary, _ = read_pytest(log, tmp_path)
    assert not check.ok
    assert summary == "pytest stopped before its summary line, after 58 cases (45 passed, 13 skipped, 0 failed or errors so far)"
    (_,), summary, _ = read_pytest("12 passed in 3.0s\n", tmp_path)
    assert summary == "every selected CUDA case passed"


def test_read_benchmark_takes_every_target_line_as_a_check(tmp_path):
    (tmp_path / "csv" / "bfloat16").mkdir(parents=True)
    (tmp_path / "csv" / "bfloat16" / "benchmark_cuda.csv").write_text("length\n")
    log = ("== table ==\n   N  attention ...\nwhere each attention overtakes full:\n  clustered-100: from N=4096\n"
           "  PASS  clustered-100: overtakes SDPA at N <= 8192: from N=4096\n"
           "  FAIL  i-clustered-100: overtakes SDPA at N <= 16384: not faster at the longest N measured\n"
           "wrote x.csv\n")
    checks, summary, files = read_benchmark(log, tmp_path)
    assert [c.ok for c in checks] == [True, True, False]
    assert checks[0].what == "the benchmark wrote its tables" and checks[2].what.startswith("i-clustered-100")
    assert "from N=4096" in summary and "wrote" not in summary
    assert files == ["csv/bfloat16/benchmark_cuda.csv"]


def test_read_lsh_memory_checks_the_spread_per_attention(tmp_path):
    folder = tmp_path / "csv" / "lsh_memory"
    folder.mkdir(parents=True)
    rows = [("lsh-1", "lsh", 1024, 4.6), ("lsh-1", "lsh", 65536, 4.7), ("lsh-4", "lsh", 1024, 4.0),
            ("lsh-4", "lsh", 65536, 6.0), ("full", "full", 1024, 8.0)]
    (folder / "benchmark_cuda.csv").write_text("attention,name,length,memory_per_element_kib\n"
                                               + "".join(f"{a},{n},{l},{m}\n" for a, n, l, m in rows))
    checks, summary, _ = read_lsh_memory("", tmp_path)
    assert [(c.what.split(":")[0], c.ok) for c in checks] == [("lsh-1", True), ("lsh-4", False)]
    assert "max/min = 1.50" in checks[1].detail and "N=65536: 6.00 KiB" in summary


def test_read_json_part_and_read_training(tmp_path):
    data = {"checks": [{"what": "x", "ok": True, "detail": ""}], "summary": "table", "files": ["csv/a.csv"]}
    path = tmp_path / "d.json"
    path.write_text(json.dumps(data))
    checks, summary, files = read_json_part(f"noise\nRESULT {path}\n", tmp_path)
    assert checks == [Check("x", True, "")] and summary == "table" and files == ["csv/a.csv"]
    assert not read_json_part("crashed", tmp_path)[0][0].ok

    run = tmp_path / "runs" / "eager"
    run.mkdir(parents=True)
    (run / "results.json").write_text(json.dumps({"steps": 200, "wall_seconds": 50.0,
                                                  "epoch_times": [{"train_seconds": 20.0}, {"train_seconds": 10.0}]}))
    (check,), summary, _ = read_training(f"python -m asr.train ...\nrun folder: {run}\n", tmp_path)
    assert check.ok and "0.150 s per step" in summary
    (check,), _, _ = read_training("run folder: /nonexistent\n", tmp_path)
    assert not check.ok


def _fake_part(name: str, code: str, budget: int = 30) -> Part:
    """A part whose process runs `code` and reads 'PASS'/'FAIL' lines like the benchmark's."""
    return Part(name, f"fake {name}", budget, lambda out: [sys.executable, "-c", code],
                lambda log, out: ([Check(line[5:], line.startswith("PASS")) for line in log.splitlines()
                                   if line.startswith(("PASS", "FAIL"))], "summary of " + name, []))


def test_run_parts_resumes_skipping_finished_parts(tmp_path):
    counter = tmp_path / "runs.txt"
    count = f"open({str(counter)!r}, 'a').write('x');"
    parts = (_fake_part("good", count + "print('PASS a')"),
             _fake_part("bad", count + "print('FAIL b')"),
             _fake_part("crash", count + "raise SystemExit(3)"),
             _fake_part("slow", "import time; time.sleep(30)", budget=1))
    first = run_parts(parts, tmp_path, total_budget=100, say=lambda text: None)
    assert [r.status for r in first] == ["passed", "failed", "error", "timeout"]
    assert counter.read_text() == "xxx"
    assert "exit status 3" in first[2].summary and "budget of 1 s" in first[3].summary
    assert load_result(tmp_path, "bad") == first[1]

    # a rerun runs only the parts without a verdict (error, timeout) and those named in redo
    second = run_parts(parts[:3], tmp_path, total_budget=100, redo=("good",), say=lambda text: None)
    assert [r.status for r in second] == ["passed", "failed", "error"]
    assert counter.read_text() == "xxxxx"

    # parts that do not fit in what is left of the budget wait for the next run
    third = run_parts((_fake_part("later", "print('PASS c')", budget=50),), tmp_path, total_budget=10,
                      say=lambda text: None)
    assert third[0].status == "not run" and load_result(tmp_path, "later") is None


def test_report_lists_every_part_and_failed_check(tmp_path):
    results = [PartResult("good", "passed", 3.0, [Check("a", True)], "table of good", ["csv/x.csv"]),
               PartResult("bad", "failed", 4.0, [Check("b", False, "1.5x")], "")]
    parts = (_fake_part("good", ""), _fake_part("bad", ""))
    text = format_report(parts, results, "H100")
    assert "| good | passed | 3 | 1 of 1 |" in text and "| bad | failed | 4 | 0 of 1 |" in text
    assert "Not all checks passed" in text and "- bad: b (1.5x)" in text
    assert "table of good" in text and "`csv/x.csv`" in text


def test_main_writes_the_report_and_exits_by_verdict(tmp_path):
    passing = _fake_part("cuda_tests", "print('PASS a')")
    failing = _fake_part("profiles", "print('FAIL b')")
    assert gpu_report.main(["--out", str(tmp_path / "a")], parts=(passing,), cuda_available=lambda: True) == 0
    assert "All checks passed" in (tmp_path / "a" / "REPORT.md").read_text()
    assert gpu_report.main(["--out", str(tmp_path / "b")], parts=(passing, failing), cuda_available=lambda: True) == 1
    assert "- profiles: b" in (tmp_path / "b" / "REPORT.md").read_text()
    # the report again from the saved results, without running anything (and without CUDA)
    (tmp_path / "b" / "REPORT.md").unlink()
    assert gpu_report.main(["--out", str(tmp_path / "b"), "--report-only"], parts=(passing, failing),
                           cuda_available=lambda: False) == 1
    assert "| cuda_tests | passed |" in (tmp_path / "b" / "REPORT.md").read_text()


def test_without_cuda_it_says_so_in_one_line_and_exits_2(tmp_path):
    # The GPU is hidden: on a CUDA machine this test is one of the report's own cuda_tests (-k cuda),
    # and with the GPU visible it would run the whole report inside that part.
    completed = subprocess.run([sys.executable, "-m", "asr.benchmarks.gpu_report", "--out", str(tmp_path / "r")],
                               cwd=ROOT, capture_output=True, text=True, timeout=120,
                               env={**os.environ, "CUDA_VISIBLE_DEVICES": ""})
    assert completed.returncode == 2
    assert completed.stdout.strip().count("\n") == 0 and "no CUDA device" in completed.stdout
    assert not (tmp_path / "r").exists()


def test_centroid_route_timing_and_profile_run_on_the_cpu(tmp_path):
    """The measuring code of the profiles and centroid_routes parts, on the CPU at small sizes."""
    import torch
    from attention_ext.attentions.clustered import centroid_routes
    from asr.benchmarks.gpu_report.measure import profile_summary, run_centroid_routes

    assert centroid_routes.forced_route("cpu") is None
    shape = dict(batch=2, heads=2, dim=16)
    data = run_centroid_routes(tmp_path, repeats=1, cases=[("tiny, padded", shape, 160, True), ("tiny", shape, 128, False)],
                               device="cpu", dtypes=(torch.float32,))
    assert centroid_routes.forced_route("cpu") is None   # every route forced is undone
    padded, unpadded = data["rows"]
    assert padded[:3] == ("float32", "tiny, padded", 160) and padded[-1] in ("unfused", "sdpa")
    assert unpadded[:3] == ("float32", "tiny", 128)
    assert [c["ok"] for c in data["checks"]] == [True]
    assert (tmp_path / "csv" / "centroid_routes_cpu.csv").read_text().count("\n") == 3
    assert "| float32 | tiny, padded | 160 |" in data["summary"]

    text, numbers = profile_summary("clustered-100", 256, torch.float32, tmp_path, device="cpu")
    assert numbers["wall_ms"] > 0 and numbers["kernel_ms"] == 0
    assert "ms per forward+backward" in text and (tmp_path / "profiles").iterdir()


def test_benchmark_without_targets_passes_when_its_tables_are_written(tmp_path):
    """float32 on CUDA has no targets: its verdict is that the tables were written (on the H200 the
    part was an 'error' for want of any check, though it had run)."""
    (check,), _, _ = read_benchmark("== table ==\ntargets: none apply\nwrote a.csv and a.png\n", tmp_path)
    assert check.ok
    (check,), _, _ = read_benchmark("Traceback ...\n", tmp_path)
    assert not check.ok


def test_corpus_option_links_a_prepared_corpus_for_the_training_parts(tmp_path):
    corpus = tmp_path / "made_elsewhere"
    corpus.mkdir()
    out = tmp_path / "report"
    assert "holds no synth_cuts_train.jsonl.gz" in gpu_report.link_corpus(corpus, out / "synth")
    (corpus / "synth_cuts_train.jsonl.gz").write_bytes(b"")
    assert gpu_report.link_corpus(corpus, out / "synth") is None
    assert (out / "synth").resolve() == corpus.resolve()
    assert gpu_report.link_corpus(corpus, out / "synth") is None        # a rerun finds the same link
    other = tmp_path / "other"
    other.mkdir()
    (other / "synth_cuts_train.jsonl.gz").write_bytes(b"")
    assert "already holds a corpus" in gpu_report.link_corpus(other, out / "synth")
    # main links it before the training parts run, and refuses a folder without a corpus (exit 2)
    seen = tmp_path / "seen.txt"
    part = Part("training_eager", "fake", 30,
                lambda out: [sys.executable, "-c", f"import os; open({str(seen)!r}, 'w').write(str(os.path.isdir({str(out / 'synth')!r})))"],
                lambda log, out: ([Check("ran", True)], "", []))
    assert gpu_report.main(["--out", str(tmp_path / "r2"), "--corpus", str(corpus)], parts=(part,),
                           cuda_available=lambda: True) == 0
    assert seen.read_text() == "True"
    assert gpu_report.main(["--out", str(tmp_path / "r3"), "--corpus", str(tmp_path)], parts=(part,),
                           cuda_available=lambda: True) == 2


def test_long_n_part_runs_the_long_table_and_reads_its_targets_on_the_cpu(tmp_path, capsys):
    """The long_n part's benchmark command, with cuda and bfloat16 swapped for cpu and float32 and
    tiny lengths standing in for 16,384..262,144: it runs here, and read_benchmark takes its targets
    (the long table's) as checks."""
    from attention_ext.benchmarks.speed.__main__ import main as benchmark_main
    [part] = [p for p in PARTS if p.name == "long_n"]
    command = part.command(tmp_path)
    assert command[1:3] == ["-m", "attention_ext.benchmarks.speed"]
    text = " ".join(command)
    assert "--device cuda --dtype bfloat16 --shapes long --full-backend flash" in text
    argv = [{"cuda": "cpu", "bfloat16": "float32"}.get(arg, arg) for arg in command[3:]]
    assert benchmark_main(argv + ["--lengths", "64", "128", "--attentions", "full", "clustered-4", "linear",
                                  "--repeats", "1", "--warmup", "0", "--threads", "1"]) == 0
    log = capsys.readouterr().out
    checks, summary, files = read_benchmark(log, tmp_path)
    assert checks[0].what == "the benchmark wrote its tables" and "2 'wrote' lines" in checks[0].detail
    targets = [check.what for check in checks[1:]]
    for label in ("clustered-4", "linear"):
        for quantity, factor in (("time", "1.5"), ("memory", "1.3")):
            # once per pass (forward, forward+backward)
            assert sum(what.startswith(f"{label}: {quantity} per element within {factor}x over N=64..128")
                       for what in targets) == 2
    assert files == ["csv/long_n/benchmark_cpu_long.csv", "csv/long_n/benchmark_cpu_long_forward.csv"]
    assert "full = full()  [SDPA kernel flash]" in summary


def test_profile_part_compares_the_kernel_routes(tmp_path):
    """The GPU report's profile part profiles each case with both kernel routes and tabulates
    kernels per pass and the GPU busy share (without a GPU: Triton's interpreter on the CPU, which
    tests/conftest.py turns on, and no kernels counted)."""
    pytest.importorskip("triton")
    import torch
    from attention_ext.attentions.clustered import kernel_routes
    from attention_ext.attentions.clustered_triton import triton_interpreted
    from asr.benchmarks.gpu_report.measure import run_profiles

    device = "cpu" if triton_interpreted() else "cuda"
    data = run_profiles(tmp_path, cases=(("clustered-8", 40, torch.float32),), device=device)
    assert kernel_routes.forced_route(device) is None   # every route forced is undone
    assert [c["ok"] for c in data["checks"]] == [True, True]
    assert [n["kernels"] for n in data["numbers"]] == ["extension", "triton"]
    assert "| clustered-8 | 40 | float32 | triton |" in data["summary"]
    assert sorted(p.name for p in (tmp_path / "profiles").iterdir()) == [
        "profile_clustered-8_40_float32_extension.txt", "profile_clustered-8_40_float32_triton.txt"]

"""The parts of the GPU report: what each runs, within what time, and how its output is read.

Every part runs in its own process (a crash or hang in one costs that part alone), with its output
kept in `<out>/parts/<name>.log` and its result in `<out>/parts/<name>.json`; a part whose result
file says it finished is not run again (report.py). A part's budget is the most it may take: 1.4-2x
what it took on an H200 on 2026-11-27 (attention_ext/RESULTS.md, "The GPU: status and known costs"), estimates for the
parts added since (training_graphed: as training_eager; steps_demo and steps_wsj: about 10 s of
steps per mode and model, and one compilation per model, ~30 s, in compiled mode; not yet run).
The default parts' budgets add up to at most 10 minutes; a part that does not fit in what is
left of them is left for the next run of the command (resumable).

training_compiled's budget problem (H200, 2026-11-27): its first attempt failed in inductor (the
tiling assertion asr.model.encoder.compile_encoder now works around); then its first 20 steps took
76 s and 200 steps did not fit in 115 s. Our reading (not profiled): the encoder compiles for the
first batch's shape, again with dynamic shapes from the second batch on, and once more for
validation (eval mode), each forward and backward. 250 s holds that and 200 steps at 0.15 s, but
with the compiled step tables it does not fit in the 10 minutes, so it runs by name only
(--parts training_compiled). So does long_n, the kernels at long N (estimated, not yet run: about
30 s of passes, the first call's Triton compilations and the process's start; budget 90 s).
"""
from __future__ import annotations

import csv
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from asr.benchmarks.gpu_report.checks import Check
from asr.benchmarks.gpu_report.training_steps import reader, step_benchmark_command


@dataclass
class PartResult:
    name: str
    status: str                      # "passed" | "failed" (a check failed) | "error" (exit status) | "timeout"
    seconds: float
    checks: list[Check] = field(default_factory=list)
    summary: str = ""                # Markdown for the report
    files: list[str] = field(default_factory=list)   # relative to the output folder

    @property
    def ok(self) -> bool:
        return self.status == "passed"


@dataclass(frozen=True)
class Part:
    name: str
    title: str
    budget_seconds: int
    command: Callable[[Path], list[str]]                   # the output folder -> argv
    read: Callable[[str, Path], tuple[list[Check], str, list[str]]]   # (log, out) -> checks, summary, files
    default: bool = True             # run without --parts (the default parts' budgets fit in 10 minutes)


# ---- reading the outputs ---------------------------------------------------------------------

def read_pytest(log: str, out: Path) -> tuple[list[Check], str, list[str]]:
    """pytest -q's last line: 'N passed, M failed, K skipped in S s'; FAILED lines as the summary."""
    counts = {kind: int(n) for n, kind in re.findall(r"(\d+) (passed|failed|errors?|skipped|deselected)", log)}
    failed = counts.get("failed", 0) + counts.get("error", 0) + counts.get("errors", 0)
    passed = counts.get("passed", 0)
    failures = [line for line in log.splitlines() if line.startswith(("FAILED", "ERROR"))]
    checks = [Check("the CUDA test cases pass", passed > 0 and failed == 0,
                    f"{passed} passed, {failed} failed or errors, {counts.get('skipped', 0)} skipped")]
    finished = re.search(r"(passed|failed|errors?|skipped|deselected).* in [\d.]+s", log) is not None
    if failures:
        summary = "\n".join(f"- `{line}`" for line in failures[:40])
    elif finished:
        summary = "every selected CUDA case passed"
    else:   # stopped (its budget) before pytest's summary line: say how far the progress dots got
        progress = "".join(line.split(" [")[0] for line in log.splitlines()
                           if re.fullmatch(r"[.sFExX]+( +\[ *\d+%\])?", line.strip()))
        summary = (f"pytest stopped before its summary line, after {len(progress)} cases "
                   f"({progress.count('.')} passed, {progress.count('s')} skipped, "
                   f"{progress.count('F') + progress.count('E')} failed or errors so far)")
    return checks, summary, []


def read_benchmark(log: str, out: Path) -> tuple[list[Check], str, list[str]]:
    """attention_ext.benchmarks.speed's output: its tables and overtaking lines as they are, each target's
    PASS / FAIL line as a check; the CSVs it wrote."""
    written = [line for line in log.splitlines() if line.startswith("wrote ")]
    # A table for which no target applies (float32 on CUDA) still has a verdict: that it was written.
    checks = [Check("the benchmark wrote its tables", bool(written), f"{len(written)} 'wrote' lines")]
    checks += [Check(line.strip()[5:].strip(), line.strip().startswith("PASS"))
               for line in log.splitlines() if line.strip().startswith(("PASS ", "FAIL "))]
    tables = "\n".join(line for line in log.splitlines() if not line.startswith("wrote "))
    files = sorted(str(p.relative_to(out)) for p in out.glob("csv/**/*.csv"))
    return checks, f"```\n{tables.strip()}\n```", files


def read_lsh_memory(log: str, out: Path) -> tuple[list[Check], str, list[str]]:
    """LSH's peak memory per element over N from the CSV: within 1.3x of its smallest value."""
    path = out / "csv" / "lsh_memory" / "benchmark_cuda.csv"
    checks, lines = [], []
    if path.exists():
        with open(path) as handle:
            rows = [r for r in csv.DictReader(handle) if r["name"] == "lsh" and r["memory_per_element_kib"]]
        for label in dict.fromkeys(r["attention"] for r in rows):
            values = {int(r["length"]): float(r["memory_per_element_kib"]) for r in rows if r["attention"] == label}
            spread = max(values.values()) / min(values.values())
            checks.append(Check(f"{label}: peak memory per element within 1.3x up to N={max(values)}", spread <= 1.3,
                                f"max/min = {spread:.2f}"))
            lines.append(f"- {label}: " + ", ".join(f"N={n}: {kib:.2f} KiB" for n, kib in sorted(values.items())))
    else:
        checks.append(Check("the LSH memory CSV was written", False, str(path)))
    return checks, "\n".join(lines) + "\n\n" + read_benchmark(log, out)[1], [str(path.relative_to(out))]


def read_json_part(log: str, out: Path) -> tuple[list[Check], str, list[str]]:
    """Parts run by measure.py print one line 'RESULT <path>' naming a JSON file with checks,
    summary and files."""
    import json
    match = re.search(r"^RESULT (.+)$", log, flags=re.MULTILINE)
    if not match:
        return [Check("the part wrote its result", False, "no RESULT line")], "", []
    data = json.loads(Path(match.group(1)).read_text())
    return [Check(**c) for c in data["checks"]], data["summary"], data["files"]


def read_training(log: str, out: Path) -> tuple[list[Check], str, list[str]]:
    """asr.train's results.json (the run folder is the wrapper's last 'run folder: <dir>' line)."""
    import json
    match = re.findall(r"^run folder: (.+)$", log, flags=re.MULTILINE)
    results = Path(match[-1]) / "results.json" if match else None
    if results is None or not results.exists():
        return [Check("200 training steps finished", False, "no results.json")], "", []
    data = json.loads(results.read_text())
    steps = data.get("steps", 0)
    seconds = sum(e.get("train_seconds", 0.0) for e in data.get("epoch_times", []))
    summary = (f"{steps} steps; {seconds:.1f} s of training (epoch timer), "
               f"{seconds / steps:.3f} s per step incl. the first (compiling) steps; "
               f"wall {data.get('wall_seconds', 0):.0f} s" if steps else "no steps")
    return [Check("200 training steps finished", steps >= 200, f"{steps} steps")], summary, []


# ---- the parts -------------------------------------------------------------------------------

PYTHON = sys.executable


def _benchmark(dtype: str) -> Callable[[Path], list[str]]:
    def command(out: Path) -> list[str]:
        return [PYTHON, "-m", "attention_ext.benchmarks.speed", "--device", "cuda", "--dtype", dtype,
                "--shapes", "paper", "asr", "--repeats", "5", "--out", str(out / "csv" / dtype)]
    return command


def _training(mode: str) -> Callable[[Path], list[str]]:
    def command(out: Path) -> list[str]:
        return [PYTHON, "-m", "asr.benchmarks.gpu_report.measure", "training", "--out", str(out),
                "--compile", str(mode == "compiled").lower(), "--graphs", str(mode == "graphed").lower(),
                "--name", mode]
    return command


PARTS = (
    Part("cuda_tests", "The CUDA test cases of tests/attention_ext", 90,
         lambda out: [PYTHON, "-m", "pytest", "-q", "-p", "no:cacheprovider", "tests/attention_ext", "-k", "cuda",
                      "--maxfail=50"], read_pytest),
    Part("benchmark_bfloat16", "Benchmark in bfloat16 (paper and ASR shapes), overtaking points against SDPA", 40,
         _benchmark("bfloat16"), read_benchmark),
    Part("benchmark_float32", "Benchmark in float32 (paper and ASR shapes), overtaking points against SDPA", 25,
         _benchmark("float32"), read_benchmark),
    Part("lsh_memory", "LSH's peak memory per element up to N=65,536 (float32)", 15,
         lambda out: [PYTHON, "-m", "attention_ext.benchmarks.speed", "--device", "cuda", "--shapes", "paper",
                      "--attentions", "full", "lsh-1", "lsh-4", "--lengths", "1024", "4096", "16384", "65536",
                      "--max-length", "full=16384", "--repeats", "3", "--out", str(out / "csv" / "lsh_memory")],
         read_lsh_memory),
    Part("profiles", "torch.profiler, bfloat16: clustered-100 and i-clustered-100 at N=4096, i-clustered-100 at "
         "N=65,536, extension kernels against Triton kernels (kernels per pass, GPU busy share)", 40,
         lambda out: [PYTHON, "-m", "asr.benchmarks.gpu_report.measure", "profiles", "--out", str(out)], read_json_part),
    Part("centroid_routes", "Clustered attention's centroid part on CUDA: route unfused (torch operators) against sdpa", 15,
         lambda out: [PYTHON, "-m", "asr.benchmarks.gpu_report.measure", "centroid_routes", "--out", str(out)],
         read_json_part),
    Part("training_eager", "200 training steps of the demo preset (synth_iclustered), eager; generates its corpus first", 75,
         _training("eager"), read_training),
    Part("training_graphed", "200 training steps of the demo preset, trainer.cuda_graphs=true data.fixed_batch_shapes=true",
         60, _training("graphed"), read_training),
    Part("steps_demo", "Training steps of the demo preset's model at a GPU-filling batch, eager, graphed and compiled, "
         "against the plain SDPA model in the same mode", 90,
         step_benchmark_command("steps_demo", "demo", ("eager", "graphed", "compiled")),
         reader("steps_demo", demo_aim=True)),
    Part("steps_wsj", "Training steps of the WSJ preset's model (paper size, 780 positions) at a GPU-filling batch, "
         "eager, graphed and compiled, against the plain SDPA model in the same mode", 150,
         step_benchmark_command("steps_wsj", "wsj", ("eager", "graphed", "compiled")), reader("steps_wsj", demo_aim=False)),
    # Not in the default run (--parts training_compiled): steps_demo and steps_wsj time compiled
    # steps, and with them this part's compilations do not fit in the report's 10 minutes.
    Part("training_compiled", "200 training steps of the demo preset, trainer.compile=true", 250,
         _training("compiled"), read_training, default=False),
    # Not in the default run (--parts long_n): the default parts' budgets fill the 10 minutes.
    Part("long_n", "The kernels at long N (the benchmark's long table, bfloat16): N = 16,384 to 262,144, 4 heads "
         "x 32, forward and forward+backward, full through SDPA's FlashAttention kernel beside the others", 90,
         lambda out: [PYTHON, "-m", "attention_ext.benchmarks.speed", "--device", "cuda", "--dtype", "bfloat16",
                      "--shapes", "long", "--full-backend", "flash", "--time-budget", "10", "--repeats", "3",
                      "--out", str(out / "csv" / "long_n")],
         read_benchmark, default=False),
)
PART_NAMES = tuple(p.name for p in PARTS)
DEFAULT_PART_NAMES = tuple(p.name for p in PARTS if p.default)

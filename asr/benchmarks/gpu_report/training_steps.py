"""The GPU report's training-step table: `python -m asr.benchmarks.step` on the
GPU at a batch that fills it, the toolkit's encoder against the plain PyTorch model (SDPA) in the same
mode - eager, compiled (torch.compile) or graphed (CUDA graphs) - in ms per step and hours of audio
per GPU-hour, with the issue's aims as checks.

The demo preset (synth_iclustered: the synth model, i-clustered with 64 clusters, ~7.6 s
utterances) and the WSJ preset (the paper's model, conf/model/paper.yaml, 7.8 s utterances = 780
positions) on synthetic batches of their shapes (asr/benchmarks/step/workloads.py), 2400 s of audio
per batch (conf/trainer/gpu80.yaml's data.max_duration), bfloat16 mixed precision.
"""
from __future__ import annotations

import csv
import sys
from pathlib import Path
from typing import Callable

from asr.benchmarks.gpu_report.checks import Check

# The demo preset's eager figure on an H200 (attention_ext/RESULTS.md, "The GPU: status and known costs"): 200 steps of 60 s
# batches in 31.4 s, about 382 s of audio per second = hours of audio per GPU-hour; the aim is 10x.
DEMO_EAGER_AUDIO_PER_SECOND = 200 * 60 / 31.4
DEMO_AIM = 10 * DEMO_EAGER_AUDIO_PER_SECOND
# WSJ: the toolkit's step against the plain model's in the same mode, at most these ratios
WSJ_AIMS = {"full": 1.05, "i-clustered-100": 1.2}
BATCH_SECONDS = 2400
WORKLOADS = {"demo": ("synth-380", ("i-clustered-64", "plain")),
             "wsj": ("wsj", ("full", "i-clustered-100", "plain"))}


def csv_path(out: Path, name: str) -> Path:
    return out / "csv" / "training_steps" / f"{name}.csv"


def step_benchmark_command(name: str, preset: str, modes: tuple[str, ...]) -> Callable[[Path], list[str]]:
    workload, models = WORKLOADS[preset]

    def command(out: Path) -> list[str]:
        return [sys.executable, "-m", "asr.benchmarks.step", "--device", "cuda", "--precision", "bf16-mixed",
                "--modes", *modes, "--workloads", workload, "--models", *models,
                "--batch-seconds", str(BATCH_SECONDS), "--repeats", "5", "--warmup", "2",
                "--csv", str(csv_path(out, name))]
    return command


def read_rows(path: Path) -> list[dict]:
    with open(path) as handle:
        return list(csv.DictReader(handle))


def steps_table(rows: list[dict]) -> str:
    lines = ["| workload | mode | model | utterances' audio s | ms/step (median) | x plain (same mode) | "
             "h of audio per GPU-hour |", "|---|---|---|---:|---:|---:|---:|"]
    for r in rows:
        if r["error"]:
            lines.append(f"| {r['workload']} | {r['mode']} | {r['model']} | {float(r['audio_seconds_per_batch']):.0f} "
                         f"| {r['error']} | | |")
            continue
        ratio = f"{float(r['ratio_to_plain']):.2f}x" if r["ratio_to_plain"] else "-"
        lines.append(f"| {r['workload']} | {r['mode']} | {r['model']} | {float(r['audio_seconds_per_batch']):.0f} | "
                     f"{1000 * float(r['median_s_per_step']):.1f} | {ratio} | {float(r['audio_s_per_wall_s']):.0f} |")
    return "\n".join(lines)


def step_checks(rows: list[dict], demo_aim: bool) -> list[Check]:
    """Every cell ran; the WSJ ratios in each mode; the demo's best mode against its aim (`demo_aim`)."""
    checks = [Check(f"{r['workload']} {r['mode']} {r['model']}: {BATCH_SECONDS} s batches train", not r["error"],
                    r["error"]) for r in rows]
    for r in rows:
        aim = WSJ_AIMS.get(r["model"]) if r["workload"] == "wsj" else None
        if aim is not None and not r["error"] and r["ratio_to_plain"]:
            ratio = float(r["ratio_to_plain"])
            checks.append(Check(f"wsj {r['mode']}: {r['model']}'s step <= {aim}x the plain SDPA model's", ratio <= aim,
                                f"{ratio:.2f}x"))
    demo = [r for r in rows if r["workload"] == "synth-380" and r["model"] != "plain" and not r["error"]]
    if demo_aim and demo:
        best = max(demo, key=lambda r: float(r["audio_s_per_wall_s"]))
        rate = float(best["audio_s_per_wall_s"])
        checks.append(Check(f"demo preset: >= 10x today's eager {DEMO_EAGER_AUDIO_PER_SECOND:.0f} h of audio per "
                            f"GPU-hour ({DEMO_AIM:.0f})", rate >= DEMO_AIM,
                            f"{rate:.0f} h per GPU-hour ({rate / DEMO_EAGER_AUDIO_PER_SECOND:.1f}x), {best['mode']}"))
    return checks


def reader(name: str, demo_aim: bool) -> Callable[[str, Path], tuple[list[Check], str, list[str]]]:
    """The part's CSV as a table, and its checks (step_checks)."""
    def read(log: str, out: Path):
        path = csv_path(out, name)
        if not path.exists():
            return [Check("the step benchmark wrote its CSV", False, str(path))], "", []
        rows = read_rows(path)
        header = "\n".join(line for line in log.splitlines() if line.startswith(("cpu:", "device:", "  ")))
        summary = (f"Synthetic batches of the preset's shapes, {BATCH_SECONDS} s of audio each, bfloat16 autocast; "
                   f"median of 5 steps after 2. Hours of audio per GPU-hour = audio seconds per second.\n\n"
                   f"```\n{header}\n```\n\n{steps_table(rows)}")
        return step_checks(rows, demo_aim), summary, [str(path.relative_to(out))]
    return read

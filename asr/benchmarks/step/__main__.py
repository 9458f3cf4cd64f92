"""python -m asr.benchmarks.step: seconds per training step of the toolkit's model with each attention
against the same model written plainly in PyTorch, on the same batches.

    python -m asr.benchmarks.step                                   # every workload, the default models
    python -m asr.benchmarks.step --workloads synth-380 wsj --repeats 7
    python -m asr.benchmarks.step --breakdown --workloads synth-380 --models full i-clustered-100 plain

A step is what Lightning runs for one batch: forward, CTC loss, backward, gradient clipping, RAdam
(the toolkit's own optimiser settings for both models). Every model of a workload is built from one
seed and takes the same batches, in turn, round by round (the order rotated each round), so machine
load hits all alike; the table gives the median of the timed rounds, the utterance-seconds of audio
trained per wall-clock second, and each step time as a multiple of the plain model's, by the wall
clock and by the process's CPU time (which, on a machine shared with other jobs, does not count
the time spent waiting for a core; "least CPU" compares the least CPU time of each model's steps). Lightning's own per-step work (logging, progress bar,
callbacks) is not in it.

--breakdown profiles steps (torch.profiler) and prints, per model, where the time goes by stage
(asr/benchmarks/step/breakdown.py). Results: asr/benchmarks/step/RESULTS.md.

On a GPU, with the encoder eager, compiled and replayed as CUDA graphs (asr/benchmarks/step/modes.py;
each mode's models are timed together, then freed), at a batch that fills the GPU:

    python -m asr.benchmarks.step --device cuda --precision bf16-mixed --modes eager compiled graphed \
        --workloads synth-380 wsj --batch-seconds 2400 --models full i-clustered-100 plain
"""
from __future__ import annotations

import argparse
import csv
import gc
import os
import platform
import sys
from pathlib import Path

import torch

from asr.benchmarks.step.breakdown import ATTENTION, STAGES, fastest_breakdown, instrument, profiled_step
from asr.benchmarks.step.timing import StepTimes, time_workload
from asr.benchmarks.step.modes import MODES, PRECISIONS, mode_problem
from asr.benchmarks.step.workloads import MODELS, PLAIN, WORKLOADS, build_model, make_batch, with_batch_seconds
from attention_ext import parse_attention_spec

DEFAULT_MODELS = ("full", "clustered-100", "i-clustered-100", "lsh-1", "linear", PLAIN)


def machine_header(threads: int) -> str:
    """What the numbers depend on: the CPU and the instruction sets torch and MKL will use, the
    threads and the load."""
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as info:
            cpu = next((line.split(":", 1)[1].strip() for line in info if line.startswith("model name")), cpu)
    except OSError:
        pass
    capability = torch.backends.cpu.get_cpu_capability()
    mkl = os.environ.get("MKL_ENABLE_INSTRUCTIONS", "(MKL's choice)")
    lines = [f"cpu: {cpu}; ATen CPU capability {capability}; MKL_ENABLE_INSTRUCTIONS={mkl}; torch {torch.__version__}; "
             f"{threads} threads"]
    if hasattr(os, "getloadavg"):
        lines.append(f"load average at start: {os.getloadavg()[0]:.2f} on {os.cpu_count()} CPUs")
    return "\n".join(lines)


def format_table(results: list[StepTimes]) -> str:
    """One row per (workload, mode, model); "x plain" against the plain model in the same mode.
    "audio s per s" is also hours of audio trained per hour of the device."""
    header = ("workload", "mode", "model", "params", "positions", "audio s/batch", "s/step (median)", "min-max",
              "audio s per s", "x plain", "CPU s/step", "x plain (CPU)", "x plain (least CPU)")
    rows = []
    for workload, mode in dict.fromkeys((r.workload.name, r.mode) for r in results):
        group = [r for r in results if r.workload.name == workload and r.mode == mode]
        plain = next((r for r in group if r.label == PLAIN and r.ok), None)
        for r in group:
            if not r.ok:
                rows.append((workload, mode, r.label, f"{r.parameters:,}", f"{r.encoder_positions:.0f}",
                             f"{r.audio_seconds:.1f}", r.error or "no step") + ("-",) * 6)
                continue
            ratio = f"{r.median / plain.median:.2f}x" if plain else "-"
            cpu_ratio = f"{r.cpu_median / plain.cpu_median:.2f}x" if plain else "-"
            least_ratio = f"{min(r.cpu_seconds) / min(plain.cpu_seconds):.2f}x" if plain else "-"
            rows.append((workload, mode, r.label, f"{r.parameters:,}", f"{r.encoder_positions:.0f}",
                         f"{r.audio_seconds:.1f}", f"{r.median:.4f}", f"{min(r.seconds):.4f}-{max(r.seconds):.4f}",
                         f"{r.audio_per_second:.1f}", ratio, f"{r.cpu_median:.3f}", cpu_ratio, least_ratio))
    widths = [max(len(str(row[i])) for row in (header, *rows)) for i in range(len(header))]
    lines = ["| " + " | ".join(h.ljust(w) for h, w in zip(header, widths)) + " |",
             "|" + "|".join("-" * (w + 2) for w in widths) + "|"]
    lines += ["| " + " | ".join(str(c).ljust(w) for c, w in zip(row, widths)) + " |" for row in rows]
    return "\n".join(lines)


def write_csv(results: list[StepTimes], path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(["workload", "model", "parameters", "encoder_positions", "audio_seconds_per_batch",
                         "median_s_per_step", "steps_s", "audio_s_per_wall_s", "ratio_to_plain",
                         "median_cpu_s_per_step", "cpu_steps_s", "cpu_ratio_to_plain", "mode", "error"])
        for r in results:
            plain = next((p for p in results if p.workload.name == r.workload.name and p.label == PLAIN
                          and p.mode == r.mode and p.ok), None)
            if not r.ok:
                writer.writerow([r.workload.name, r.label, r.parameters, f"{r.encoder_positions:.1f}",
                                 f"{r.audio_seconds:.2f}"] + [""] * 7 + [r.mode, r.error or "no step"])
                continue
            writer.writerow([r.workload.name, r.label, r.parameters, f"{r.encoder_positions:.1f}",
                             f"{r.audio_seconds:.2f}", f"{r.median:.4f}", " ".join(f"{s:.4f}" for s in r.seconds),
                             f"{r.audio_per_second:.2f}", f"{r.median / plain.median:.3f}" if plain else "",
                             f"{r.cpu_median:.4f}", " ".join(f"{s:.4f}" for s in r.cpu_seconds),
                             f"{r.cpu_median / plain.cpu_median:.3f}" if plain else "", r.mode, ""])


def breakdown_table(workload_name: str, labels: list[str], steps: int, warmup: int) -> str:
    """Profiles `steps` steps of every model, alternating, and tabulates each stage's least time."""
    workload = WORKLOADS[workload_name]
    models = []
    for label in labels:
        torch.manual_seed(0)
        model = build_model(workload, label)
        instrument(model)
        models.append(model)
    profiles = {label: [] for label in labels}
    for round_index in range(warmup + steps):
        batch = make_batch(workload, round_index)
        for model in models:
            if round_index < warmup:
                model.step(batch)
            else:
                profiles[model.label].append(profiled_step(model, batch))
    fastest = {label: fastest_breakdown(p) for label, p in profiles.items()}
    header = ["stage (forward + backward ms, share of the stages' sum)"] + labels
    rows = []
    for stage in STAGES:
        rows.append([stage] + [_cell(sum(fastest[label].stages.get(stage, [0, 0])),
                                     sum(sum(v) for v in fastest[label].stages.values())) for label in labels])
        if stage == ATTENTION:
            operators = sorted({op for m in fastest.values() for op in m.attention_operators},
                               key=lambda op: -max(sum(m.attention_operators.get(op, [0, 0])) for m in fastest.values()))
            for op in operators:
                cells = [sum(fastest[label].attention_operators.get(op, [0, 0])) for label in labels]
                if max(cells) >= 0.5:   # operators below half a millisecond everywhere are left out
                    rows.append([f"    {op}"] + [f"{c:.1f}" if c else "" for c in cells])
    rows.append(["sum of the stages (ms)"] + [f"{sum(sum(v) for v in fastest[label].stages.values()):.1f}"
                                               for label in labels])
    rows.append(["fastest profiled step (ms)"] + [f"{fastest[label].step_ms:.1f}" for label in labels])
    widths = [max(len(r[i]) for r in (header, *rows)) for i in range(len(header))]
    lines = [f"{workload.name}: {workload.what}; the least of {steps} profiled steps per model and stage, alternating",
             "| " + " | ".join(h.ljust(w) for h, w in zip(header, widths)) + " |",
             "|" + "|".join("-" * (w + 2) for w in widths) + "|"]
    lines += ["| " + " | ".join(c.ljust(w) for c, w in zip(r, widths)) + " |" for r in rows]
    return "\n".join(lines)


def _cell(ms: float, step_ms: float) -> str:
    return f"{ms:.1f} ({100 * ms / step_ms:.0f} %)" if step_ms else "-"


def check_models(labels: list[str]) -> None:
    for label in labels:
        if label != PLAIN:
            parse_attention_spec(label)   # raises AttentionConfigError naming what is allowed


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m asr.benchmarks.step", description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter,
                                     epilog="workloads:\n" + "\n".join(f"  {w.name:12s} {w.what}"
                                                                       for w in WORKLOADS.values()))
    parser.add_argument("--workloads", nargs="+", choices=list(WORKLOADS), default=list(WORKLOADS))
    parser.add_argument("--models", nargs="+", default=list(DEFAULT_MODELS),
                        help=f"attention specs of the toolkit model, and '{PLAIN}' (default: %(default)s)")
    parser.add_argument("--repeats", type=int, default=5, help="timed rounds (median; default %(default)s)")
    parser.add_argument("--warmup", type=int, default=1, help="untimed rounds first (default %(default)s)")
    parser.add_argument("--threads", type=int, default=2, help="torch intra-op threads (default %(default)s)")
    parser.add_argument("--csv", type=Path, default=Path("benchmark_results/step_benchmark.csv"))
    parser.add_argument("--modes", nargs="+", choices=MODES, default=["eager"],
                        help="how the encoder runs: eager, compiled (torch.compile), graphed (CUDA graphs; "
                             "--device cuda only), compiled-graphs (torch.compile mode=reduce-overhead; --device "
                             "cuda only); each mode's models are timed together (default: %(default)s)")
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    parser.add_argument("--precision", choices=PRECISIONS, default="32-true",
                        help="bf16-mixed: forward and loss under bfloat16 autocast, as trainer.precision=bf16-mixed")
    parser.add_argument("--batch-seconds", type=float, default=None,
                        help="batches of about this much audio (the workload's utterance length kept; "
                             "conf/trainer/gpu80.yaml's 2400 fills an 80 GB GPU); default: the workload's own")
    parser.add_argument("--breakdown", action="store_true",
                        help="profile --repeats steps per model and print where the time goes by stage "
                             "(each stage's least time over the steps)")
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    check_models(args.models)
    problem = mode_problem(args.modes, args.device)
    if problem:
        parser.error(problem)
    if args.breakdown and (args.modes != ["eager"] or args.device != "cpu"):
        parser.error("--breakdown profiles eager CPU steps; leave out --modes and --device")
    torch.set_num_threads(args.threads)
    print(machine_header(args.threads))
    if args.device == "cuda":
        print(f"device: {torch.cuda.get_device_name()}; precision {args.precision}")
    workloads = [with_batch_seconds(WORKLOADS[name], args.batch_seconds) for name in args.workloads]
    for w in workloads:
        print(f"  {w.name}: {w.what}; model {w.model} {MODELS[w.model]}; {w.utterances} utterances per batch")
    if args.breakdown:
        for name in args.workloads:
            print()
            print(breakdown_table(name, args.models, args.repeats, args.warmup))
        return 0
    results = []
    for workload in workloads:
        for mode in args.modes:
            results += time_workload(workload, args.models, args.repeats, args.warmup,
                                     progress=lambda text: print(text, file=sys.stderr, flush=True),
                                     mode=mode, device=args.device, precision=args.precision)
            gc.collect()   # this mode's models and graphs, before the next mode's
            if args.device == "cuda":
                torch.cuda.empty_cache()
    print()
    print(format_table(results))
    if hasattr(os, "getloadavg"):
        print(f"load average at the end: {os.getloadavg()[0]:.2f}")
    write_csv(results, args.csv)
    print(f"wrote {args.csv}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

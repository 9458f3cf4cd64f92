"""python -m attention_ext.benchmarks.copy_task: the masked copy task (supplementary C.2, Fig. 5) for
full, clustered and i-clustered (several cluster counts), lsh-1 and the project's further
attentions (the list is attention_ext.comparisons.copy_task_attentions).

Each attention trains a fresh small transformer encoder (our attention modules inside) for the
same number of steps on the same batches, then is scored on fresh batches: accuracy and cross
entropy on the masked tokens. Prints a table, writes results.csv and copy_task.png (heatmaps of
accuracy over sequence length and clusters, as Fig. 5) into --out.
"""
from __future__ import annotations

import argparse
import csv
import multiprocessing
import queue
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import asdict
from pathlib import Path

import torch

from ...comparisons import copy_task_attentions
from ...registry import AttentionConfigError, parse_attention_spec
from . import CopyResult, CopyTask, TrainSettings, train_copy_task, train_in_worker

DEFAULT_LENGTHS = (31,)
DEFAULT_CLUSTERS = (4, 8, 16, 32)


def default_specs(clusters: list[int]) -> list[str]:
    return list(copy_task_attentions(clusters))


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m attention_ext.benchmarks.copy_task", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--lengths", type=int, nargs="+", default=list(DEFAULT_LENGTHS), metavar="L",
                        help="symbols per half, L (N = 2L + 2); the paper: 31 63 127 255 "
                             f"(default: {' '.join(map(str, DEFAULT_LENGTHS))})")
    parser.add_argument("--clusters", type=int, nargs="+", default=list(DEFAULT_CLUSTERS), metavar="C",
                        help="cluster counts of clustered and i-clustered "
                             f"(default: {' '.join(map(str, DEFAULT_CLUSTERS))})")
    parser.add_argument("--attentions", nargs="+", default=None, metavar="SPEC",
                        help="attention specs to train instead of the default list (full, clustered-C and "
                             "i-clustered-C for every --clusters, "
                             f"{', '.join(copy_task_attentions([])[1:])})")
    defaults = TrainSettings()
    parser.add_argument("--steps", type=int, default=defaults.steps, help="training steps per attention")
    parser.add_argument("--batch", type=int, default=defaults.batch)
    parser.add_argument("--lr", type=float, default=defaults.learning_rate)
    parser.add_argument("--warmup-steps", type=int, default=defaults.warmup_steps)
    parser.add_argument("--layers", type=int, default=defaults.layers)
    parser.add_argument("--heads", type=int, default=defaults.heads)
    parser.add_argument("--width", type=int, default=defaults.width, help="model width (heads x head dim)")
    parser.add_argument("--evaluation-batches", type=int, default=defaults.evaluation_batches)
    parser.add_argument("--seed", type=int, default=defaults.seed)
    parser.add_argument("--jobs", type=int, default=2,
                        help="attentions trained at once, in separate processes (default 2: one per core "
                             "of a 2-core machine)")
    parser.add_argument("--threads", type=int, default=1,
                        help="torch threads per job (default 1: the tensors are small, more threads "
                             "mostly wait for each other)")
    parser.add_argument("--out", type=Path, default=Path("copy_task_results"),
                        help="folder for results.csv and copy_task.png (default: copy_task_results/)")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")
    return parser


def run_all(tasks: list[CopyTask], specs: list[str], settings: TrainSettings, jobs: int, threads: int,
            progress: bool) -> list[CopyResult]:
    """Every (length, spec) pair, `jobs` at a time, with one progress bar over all their steps."""
    from tqdm import tqdm
    work = [(index, task, spec, settings) for index, (task, spec) in
            enumerate((task, spec) for task in tasks for spec in specs)]
    if jobs == 1:   # in this process, one run after the other
        torch.set_num_threads(threads)
        with tqdm(total=len(work) * settings.steps, unit="step", disable=not progress, file=sys.stderr) as bar:
            return [train_copy_task(task, spec, run_settings, on_step=lambda step, loss: bar.update(1))
                    for _, task, spec, run_settings in work]
    context = multiprocessing.get_context("spawn")
    with context.Manager() as manager, ProcessPoolExecutor(max_workers=jobs, mp_context=context) as pool:
        progress_queue = manager.Queue()
        futures = [pool.submit(train_in_worker, job, progress_queue, threads) for job in work]
        done_steps = [0] * len(work)
        bar = tqdm(total=len(work) * settings.steps, unit="step", disable=not progress, file=sys.stderr)
        finished = 0
        while finished < len(work):
            try:
                index, steps = progress_queue.get(timeout=0.5)
                bar.update(steps - done_steps[index])
                done_steps[index] = steps
            except queue.Empty:
                pass
            newly = sum(future.done() for future in futures)
            for future in futures:
                if future.done() and future.exception() is not None:
                    raise future.exception()
            if newly != finished:
                finished = newly
                bar.set_postfix_str(f"{finished}/{len(work)} runs")
        bar.close()
        return [future.result() for future in futures]


def clusters_of(spec: str) -> int | None:
    attention = parse_attention_spec(spec)
    return attention.options.get("clusters")


def format_table(results: list[CopyResult]) -> str:
    lines = [f"{'L':>4}  {'N':>4}  {'attention':<18} {'clusters':>8}  {'accuracy':>8}  {'loss':>7}  "
             f"{'train loss':>10}  {'seconds':>7}  {'CPU s':>6}"]
    lines.append("-" * len(lines[0]))
    for result in results:
        clusters = clusters_of(result.spec)
        lines.append(f"{result.length:>4}  {2 * result.length + 2:>4}  {result.spec:<18} "
                     f"{'-' if clusters is None else clusters:>8}  {result.accuracy:>8.3f}  "
                     f"{result.loss:>7.3f}  {result.train_loss:>10.3f}  {result.seconds:>7.0f}  "
                     f"{result.cpu_seconds:>6.0f}")
    return "\n".join(lines)


def write_csv(results: list[CopyResult], path: Path) -> None:
    with open(path, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=["length", "sequence_length", "spec", "name", "clusters",
                                               "accuracy", "loss", "train_loss", "seconds", "cpu_seconds"])
        writer.writeheader()
        for result in results:
            row = asdict(result)
            row.update(sequence_length=2 * result.length + 2, name=parse_attention_spec(result.spec).name,
                       clusters=clusters_of(result.spec) or "")
            writer.writerow(row)


def plot_heatmaps(results: list[CopyResult], path: Path, steps: int) -> None:
    """Fig. 5: accuracy heatmaps, sequence length across; i-clustered and clustered by cluster
    count, the other attentions by name."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    lengths = sorted({result.length for result in results})
    panels = []
    for name, title in (("iclustered", "i-clustered"), ("clustered", "clustered")):
        rows = [r for r in results if parse_attention_spec(r.spec).name == name]
        if rows:
            counts = sorted({clusters_of(r.spec) for r in rows})
            panels.append((title, "clusters", [str(c) for c in counts],
                           {(str(clusters_of(r.spec)), r.length): r.accuracy for r in rows}))
    others = [r for r in results if parse_attention_spec(r.spec).name not in ("iclustered", "clustered")]
    if others:
        specs = list(dict.fromkeys(r.spec for r in others))
        panels.append(("other attentions", "", specs, {(r.spec, r.length): r.accuracy for r in others}))
    figure, axes = plt.subplots(1, len(panels), figsize=(max(3.5, 1.6 + 1.1 * len(lengths)) * len(panels), 3.8),
                                squeeze=False, layout="constrained")
    image = None
    for axis, (title, ylabel, row_labels, accuracy) in zip(axes[0], panels):
        grid = [[accuracy.get((row, length), float("nan")) for length in lengths] for row in row_labels]
        image = axis.imshow(grid, vmin=0.0, vmax=1.0, cmap="viridis", aspect="auto", origin="lower")
        for y, row in enumerate(grid):
            for x, value in enumerate(row):
                if value == value:
                    axis.text(x, y, f"{value:.2f}", ha="center", va="center",
                              color="black" if value > 0.6 else "white", fontsize=8)
        axis.set_xticks(range(len(lengths)), [str(2 * length + 2) for length in lengths])
        axis.set_yticks(range(len(row_labels)), row_labels)
        axis.set_xlabel("sequence length N")
        axis.set_ylabel(ylabel)
        axis.set_title(title)
    figure.colorbar(image, ax=axes[0].tolist(), label="accuracy on masked tokens")
    figure.suptitle(f"masked copy task: accuracy on the masked tokens after {steps} steps")
    figure.savefig(path, dpi=120, bbox_inches="tight")
    plt.close(figure)


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    for name in ("steps", "batch", "layers", "heads", "width", "evaluation_batches", "jobs", "threads"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be >= 1, got {getattr(args, name)}")
    if min(args.lengths) < 1 or min(args.clusters) < 1:
        parser.error("--lengths and --clusters must be >= 1")
    if args.width % args.heads:
        parser.error(f"--width {args.width} must be a multiple of --heads {args.heads}")
    specs = args.attentions or default_specs(args.clusters)
    settings = TrainSettings(steps=args.steps, batch=args.batch, learning_rate=args.lr,
                             warmup_steps=args.warmup_steps, layers=args.layers, heads=args.heads,
                             width=args.width, evaluation_batches=args.evaluation_batches, seed=args.seed)
    try:
        for spec in specs:   # every spec is checked before any training
            parse_attention_spec(spec).check_head_dim(args.width // args.heads)
    except AttentionConfigError as error:
        parser.error(str(error))
    tasks = [CopyTask(length) for length in args.lengths]
    print(f"masked copy task: L in {args.lengths} (N = 2L + 2), {tasks[0].symbols} symbols, "
          f"{tasks[0].mask_fraction:.0%} masked; {args.steps} steps of batch {args.batch} per attention, "
          f"Adam lr {args.lr}; {args.layers} layers, {args.heads} heads x {args.width // args.heads}; "
          f"{args.jobs} jobs x {args.threads} threads", flush=True)
    started = time.perf_counter()
    results = run_all(tasks, specs, settings, args.jobs, args.threads, progress=not args.no_progress)
    print(format_table(results))
    args.out.mkdir(parents=True, exist_ok=True)
    write_csv(results, args.out / "results.csv")
    plot_heatmaps(results, args.out / "copy_task.png", args.steps)
    cpu = sum(result.cpu_seconds for result in results)
    print(f"total {time.perf_counter() - started:.0f} s wall; {cpu:.0f} CPU s in all, so about "
          f"{cpu / args.jobs / 60:.1f} min on {args.jobs} quiet cores at {args.threads} thread(s) per job; "
          f"wrote {args.out / 'results.csv'} and {args.out / 'copy_task.png'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

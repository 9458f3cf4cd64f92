"""The clustered-attention gap against how sharp the attention is (issue 31, part 2).

    python -m recipes.synth.sharpening --run runs/sharpening_full --train 6000   # train (or resume), then measure
    python -m recipes.synth.sharpening --run RUN_DIR                             # measure a run that kept checkpoints
    python -m recipes.synth.sharpening --run RUN_DIR --publish recipes/synth     # also copy the JSON and PNG there
    python -m recipes.synth.sharpening --run runs/sharpening_wsj --train 2000 --architecture wsj

The question: RESULTS.md explains the small clustered-attention gap of the paper-length matrix by
attention that is still nearly flat. Here, for every checkpoint a run kept at a fixed step
(checkpoints/step-NNNNNN.ckpt, `asr.train trainer.keep_checkpoints_every_n_steps=N`):

    entropy   the exact attention's entropy per layer on the split, divided by that of uniform
              attention over the keys each query sees (asr.model.diagnostics), averaged over the
              split's queries and heads; its mean over the layers is the curve's second axis
    PER       the model evaluated with every row (default: full, clustered-100, clustered-200,
              i-clustered-100, i-clustered-200, oracle-top) on the split; the gap of a row is its
              PER minus full attention's, in points

--train STEPS first trains the paper-length full preset into --run (the synth_full preset with the
paper setting's overrides of recipes.synth.experiment: ~780 encoder positions, validation every 200
steps, diagnostics every 50) for STEPS optimiser steps, keeping a checkpoint every --every steps;
run it again after an interruption and it resumes from the run's last checkpoint (ckpt_path=last),
or trains further when STEPS grew. --architecture wsj trains the paper's WSJ encoder instead of the
synth one (supplementary C.3: 9 layers, 6 heads x 32 dims, feed-forward 768; 4.15 M parameters against 1.29 M),
keeping the synth front end's stride 2 so that the length stays the paper's (~780 positions; the
WSJ model's own front end has no stride, and this corpus's 15 s utterances would give ~1,480).

Writes to --out (default: <run>/sharpening/); a run started again reuses what is there:
    matrix/               asr.cross_matrix of the kept checkpoints (columns step<N>) x the rows: one
                          cell file per evaluation, reused while the checkpoint is unchanged
    entropy/step<N>.json  the entropy per layer of one checkpoint, reused the same way
    sharpening.json       per step: entropy per layer and its mean, PER per row, gap to full per row
    sharpening.png        PER gap to full against step, one line per row; mean normalised entropy on
                          a second axis
"""
from __future__ import annotations

import argparse
import json
import re
import shutil
import sys
from pathlib import Path

from asr.core.exit_status import SUCCESS, run_command
from attention_ext import AttentionConfigError, parse_attention_spec

ROWS = ("full", "clustered-100", "clustered-200", "i-clustered-100", "i-clustered-200", "oracle-top")
REFERENCE_ROW = "full"
PRESET = "synth_full"
DEFAULT_EVERY = 500
# The encoder the long run trains (model.* values): the synth presets' own, or the paper's WSJ one
# at the synth front end's stride, i.e. at the paper length.
ARCHITECTURES = {"synth": {"layers": 6, "heads": 4, "head_dim": 32, "ff_dim": 512},
                 "wsj": {"layers": 9, "heads": 6, "head_dim": 32, "ff_dim": 768}}
STEP_CHECKPOINT = re.compile(r"^step-(\d+)\.ckpt$")


class SharpeningError(ValueError):
    """A run or option that cannot be measured; the message says what to do."""


def kept_checkpoints(run: Path) -> dict[int, Path]:
    """step -> checkpoint, for every checkpoints/step-NNNNNN.ckpt of the run, by step."""
    folder = run / "checkpoints"
    found = {int(match[1]): path for path in folder.glob("step-*.ckpt") if (match := STEP_CHECKPOINT.match(path.name))}
    if not found:
        raise SharpeningError(f"{folder} holds no checkpoints of fixed steps (step-NNNNNN.ckpt); train with "
                              f"trainer.keep_checkpoints_every_n_steps=N, or give --train STEPS")
    return dict(sorted(found.items()))


# ---- training ------------------------------------------------------------------------------------------
def training_overrides(steps: int, every: int, architecture: str = "synth") -> list[str]:
    """asr.train overrides of the long run: the paper setting, the encoder, a step budget, kept checkpoints."""
    from recipes.synth.experiment import training_budget
    from recipes.synth.experiment_settings import SETTINGS
    encoder = [f"model.{key}={value}" for key, value in ARCHITECTURES[architecture].items()]
    return [*SETTINGS["paper"].preset_overrides(PRESET), *encoder, *training_budget(steps, None),
            f"trainer.keep_checkpoints_every_n_steps={every}", "test=false"]


def check_architecture(run: Path, architecture: str) -> None:
    """A run folder that holds another encoder cannot be resumed as this one: said before training."""
    stored = run / "config.yaml"
    if not stored.is_file():
        return
    from omegaconf import OmegaConf
    model = OmegaConf.load(stored).model
    differing = {key: model.get(key) for key, value in ARCHITECTURES[architecture].items() if model.get(key) != value}
    if differing:
        raise SharpeningError(f"{run} holds another encoder than --architecture {architecture} "
                              f"({', '.join(f'model.{key}={value}' for key, value in differing.items())}); "
                              f"give that run's architecture or another --run folder")


def train_if_needed(run: Path, steps: int, every: int, architecture: str, extra: list[str]) -> int:
    """Trains (or resumes, or extends) the run to `steps` steps; returns asr.train's exit status."""
    results = run / "results.json"
    if results.is_file() and json.loads(results.read_text()).get("steps", 0) >= steps:
        print(f"[sharpening] {run}: trained to {steps} steps already", flush=True)
        return SUCCESS
    from recipes.synth.experiment import train_preset
    return train_preset(PRESET, run, [], [*training_overrides(steps, every, architecture), *extra])


# ---- entropy per checkpoint ------------------------------------------------------------------------------
def checkpoint_entropy(checkpoint: Path, split: str, limit: int | None) -> dict:
    """The checkpoint's mean relative attention entropy per layer on `split` (first `limit` batches)."""
    import torch
    from asr.evaluation.evaluation import load_model
    from asr.evaluation.evaluation_data import evaluation_data
    from asr.model.diagnostics import layer_attention_entropy
    from asr.model.recognizer import EVALUATION_SEED, seed_evaluation_batch
    model = load_model(checkpoint)
    data = evaluation_data(model, checkpoint, split, progress=False)
    totals: list[list[float]] = []
    with torch.no_grad():
        for index, batch in enumerate(data.datamodule.dataloader(data.split)):
            if limit is not None and index >= limit:
                break
            seed_evaluation_batch(EVALUATION_SEED, index)    # an attention with random draws: as asr.evaluate
            sums = layer_attention_entropy(model, batch["features"], batch["feature_lengths"])
            totals = [[a + s, b + c] for (a, b), (s, c) in zip(totals or [[0.0, 0]] * len(sums), sums)]
    layers = [total / count if count else None for total, count in totals]
    known = [value for value in layers if value is not None]
    return {"layers": layers, "mean": sum(known) / len(known) if known else None,
            "queries_per_layer": int(totals[0][1]) if totals else 0}


def cached_entropy(out: Path, step: int, checkpoint: Path, split: str, limit: int | None) -> dict:
    """checkpoint_entropy, kept in out/entropy/step<N>.json while the checkpoint and settings are the same."""
    from asr.evaluation.attention_matrix import checkpoint_identity
    path = out / "entropy" / f"step{step}.json"
    key = {"checkpoint": checkpoint_identity(checkpoint), "split": split, "limit": limit}
    if path.is_file():
        cached = json.loads(path.read_text())
        if {name: cached.get(name) for name in key} == key:
            return cached
    entropy = {**key, **checkpoint_entropy(checkpoint, split, limit)}
    path.parent.mkdir(parents=True, exist_ok=True)
    temporary = path.with_suffix(".json.tmp")
    temporary.write_text(json.dumps(entropy, indent=2) + "\n")
    temporary.replace(path)              # a file that exists is complete
    return entropy


# ---- the curve ------------------------------------------------------------------------------------------
def sharpening_points(matrix: dict, entropies: dict[int, dict], rows: list[str]) -> list[dict]:
    """Per kept step: the entropy, PER per row, and each row's gap to full (PER points as fractions)."""
    cells = {(row["evaluate_with"], label): cell for row in matrix["rows"] for label, cell in row["cells"].items()}
    points = []
    for step, entropy in sorted(entropies.items()):
        per = {row: cells[row, f"step{step}"]["per"] for row in rows}
        reference = per[REFERENCE_ROW]
        gap = {row: None if value is None or reference is None else value - reference
               for row, value in per.items() if row != REFERENCE_ROW}
        points.append({"step": step, "entropy_per_layer": entropy["layers"], "mean_entropy": entropy["mean"],
                       "per": per, "gap_to_full": gap})
    return points


def plot(points: list[dict], rows: list[str], title: str, path: Path) -> None:
    """PER gap to full against step per row; the mean normalised entropy on a second axis."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    steps = [point["step"] for point in points]
    figure, axis = plt.subplots(figsize=(8, 4.8))
    markers = "osD^v<>p"
    for index, row in enumerate(row for row in rows if row != REFERENCE_ROW):
        gaps = [None if point["gap_to_full"][row] is None else 100 * point["gap_to_full"][row] for point in points]
        axis.plot(steps, gaps, marker=markers[index % len(markers)], label=row)
    axis.axhline(0.0, color="gray", linewidth=0.8)
    axis.set_xlabel("training step")
    axis.set_ylabel("PER gap to full attention (points)")
    axis.grid(alpha=0.3)
    entropy_axis = axis.twinx()
    entropy_axis.plot(steps, [point["mean_entropy"] for point in points], color="black", linestyle="--",
                      marker="s", markersize=4, label="mean normalised entropy (right)")
    entropy_axis.set_ylim(0, 1.05)
    entropy_axis.set_ylabel("attention entropy / uniform (mean over layers)")
    handles = axis.get_legend_handles_labels()[0] + entropy_axis.get_legend_handles_labels()[0]
    axis.legend(handles=handles, fontsize=8, loc="best")
    axis.set_title(title, fontsize=10)
    figure.tight_layout()
    figure.savefig(path, dpi=120)
    plt.close(figure)


def measure(args: argparse.Namespace) -> int:
    """Evaluates and measures every kept checkpoint (reusing what is cached); writes the JSON and PNG;
    returns the exit status."""
    out = args.out or args.run / "sharpening"
    checkpoints = kept_checkpoints(args.run)
    from asr import cross_matrix
    argv = [*(f"step{step}={path}" for step, path in checkpoints.items()), "--specs", *args.rows,
            "--split", args.split, "--out", str(out / "matrix")]
    if args.limit is not None:
        argv += ["--limit", str(args.limit)]
    if args.threads is not None:     # for the evaluations (asr.cross_matrix runs in this process) and the entropies
        import torch
        torch.set_num_threads(args.threads)
    code = cross_matrix.main(argv)
    if code != SUCCESS:
        return code                     # asr.cross_matrix has said why
    matrix = json.loads((out / "matrix" / "matrix.json").read_text())
    entropies = {}
    for step, path in checkpoints.items():
        entropies[step] = cached_entropy(out, step, path, args.split, args.limit)
        print(f"[sharpening] step {step}: mean normalised attention entropy {entropies[step]['mean']:.3f}",
              flush=True)
    result = {"run": str(args.run), "split": matrix["split"], "rows": args.rows, "limit": args.limit,
              "points": sharpening_points(matrix, entropies, args.rows)}
    (out / "sharpening.json").write_text(json.dumps(result, indent=2) + "\n")
    plot(result["points"], args.rows, f"{args.run.name}: PER gap to full attention as the attention sharpens "
                                      f"({matrix['split']} split)", out / "sharpening.png")
    if args.publish is not None:
        args.publish.mkdir(parents=True, exist_ok=True)
        stem = published_stem(args.run)
        for suffix in (".json", ".png"):
            shutil.copyfile(out / f"sharpening{suffix}", args.publish / f"{stem}{suffix}")
        print(f"[sharpening] copied {stem}.json and .png to {args.publish}", flush=True)
    print(format_table(result["points"], args.rows))
    print(f"[sharpening] wrote {out}/sharpening.json and sharpening.png", flush=True)
    return SUCCESS


def published_stem(run: Path) -> str:
    """--publish's file name: sharpening_<run folder name>, or the folder's name if it starts so."""
    return run.name if run.name.startswith("sharpening") else f"sharpening_{run.name}"


def format_table(points: list[dict], rows: list[str]) -> str:
    """A markdown table: step, mean entropy, full PER and each row's gap (points)."""
    others = [row for row in rows if row != REFERENCE_ROW]
    lines = ["| step | mean entropy | full PER | " + " | ".join(f"{row} gap" for row in others) + " |",
             "|---:|---:|---:|" + "---:|" * len(others)]
    for point in points:
        def points_text(value):
            return "-" if value is None else f"{100 * value:+.2f}"
        full = point["per"][REFERENCE_ROW]
        lines.append(f"| {point['step']} | {point['mean_entropy']:.3f} | "
                     f"{'-' if full is None else format(100 * full, '.2f')} | "
                     + " | ".join(points_text(point["gap_to_full"][row]) for row in others) + " |")
    return "\n".join(lines) + "\n"


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m recipes.synth.sharpening", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--run", type=Path, required=True, help="the asr.train run folder (its checkpoints/step-*.ckpt)")
    parser.add_argument("--train", type=int, default=None, metavar="STEPS",
                        help=f"first train (or resume) the paper-length {PRESET} preset into --run for STEPS steps")
    parser.add_argument("--every", type=int, default=DEFAULT_EVERY,
                        help=f"--train: keep a checkpoint every N steps (default: {DEFAULT_EVERY})")
    parser.add_argument("--architecture", choices=sorted(ARCHITECTURES), default="synth",
                        help="--train: the synth presets' encoder (default) or the paper's WSJ one at the same "
                             "length (9 layers, 6 heads x 32, feed-forward 768)")
    parser.add_argument("--train-override", action="append", default=[], metavar="KEY=VALUE",
                        help="--train: an extra asr.train override (repeatable)")
    parser.add_argument("--rows", nargs="+", default=list(ROWS), metavar="SPEC",
                        help=f"evaluate-with attention specs; must include {REFERENCE_ROW} (default: {' '.join(ROWS)})")
    parser.add_argument("--split", default="dev", help="split of the run's corpus (default: dev)")
    parser.add_argument("--limit", type=int, default=None, help="only the first N batches (a quick look)")
    parser.add_argument("--threads", type=int, default=None,
                        help="torch threads of the evaluations (default: torch's; 1 beside other work: "
                             "two-thread evaluations slow down many times on a busy machine)")
    parser.add_argument("--out", type=Path, default=None, help="output folder (default: <run>/sharpening)")
    parser.add_argument("--publish", type=Path, default=None, metavar="DIR",
                        help="also copy sharpening.json and .png into DIR as sharpening_<run name>.json / .png "
                             "(<run name>.json / .png where the run's name starts with 'sharpening')")
    return parser


def run_sharpening(args: argparse.Namespace) -> int:
    if REFERENCE_ROW not in args.rows:
        raise SharpeningError(f"--rows {' '.join(args.rows)}: the gaps are to {REFERENCE_ROW}; add it to --rows")
    for spec in args.rows:
        parse_attention_spec(spec)              # a bad row stops the command before any work
    for option, value in (("--train", args.train), ("--every", args.every), ("--limit", args.limit),
                          ("--threads", args.threads)):
        if value is not None and value < 1:
            raise SharpeningError(f"{option}={value} must be >= 1")
    args.rows = list(dict.fromkeys(args.rows))
    if args.train is not None:
        check_architecture(args.run, args.architecture)
        status = train_if_needed(args.run, args.train, args.every, args.architecture, args.train_override)
        if status != SUCCESS:
            print(f"recipes.synth.sharpening: asr.train stopped with exit status {status} (its message is above)",
                  file=sys.stderr)
            return status
    return measure(args)


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)       # a bad option: argparse exits with USAGE_ERROR
    return run_command("recipes.synth.sharpening", lambda: run_sharpening(args),
                       usage_errors=(SharpeningError, AttentionConfigError),
                       resume_hint="run the same command again: training resumes from its last checkpoint and "
                                   "the evaluations and entropies computed so far are reused")


if __name__ == "__main__":
    sys.exit(main())

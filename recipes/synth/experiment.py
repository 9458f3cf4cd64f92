"""The train-with x evaluate-with experiment of the paper's sec. 4.1 (Table 1) on the built-in corpus.

    python -m recipes.synth.experiment                        # the paper's regime (~780 positions)
    python -m recipes.synth.experiment --setting short        # the synth presets as they are (~390)
    python -m recipes.synth.experiment --steps 600            # another training budget per preset
    python -m recipes.synth.experiment --presets synth_full synth_iclustered
    python -m recipes.synth.experiment --presets synth_shared_full synth_lsh1 synth_lsh4 \
        --columns-from recipes/synth/results.json         # re-run three columns, the rest as published

Trains the six synth presets one after the other (full, shared_full, lsh1, lsh4, clustered,
iclustered), each for the same number of optimiser steps (--steps: a step budget, so a shared or
busy machine does not decide which model learns), into <out>/<preset>/, then evaluates every
preset's best checkpoint with every evaluate-with spec (`asr.cross_matrix`) into <out>/matrix/,
checks the paper's findings on it, and writes <out>/results.json and <out>/training_curves.png.

Two settings (--setting):
  paper  the paper's sequence length: utterances twice as long (~16 s, a corpus of their own in
         data/synth_x2, generated on first use) through the presets' stride-2 front end give ~780
         encoder positions (the paper's WSJ average); clustered and i-clustered train with 100
         clusters; the matrix rows use 100 and 200 clusters as in Table 1.
  short  the synth presets unchanged: subsampling 2, ~390 positions, 64 clusters in training,
         rows with 32 and 64 clusters (the cluster counts scaled with the length).

--columns-from RESULTS_JSON completes the matrix with the columns of an earlier run's results.json
that this run does not train (their cells as they were, marked with the file they came from), so that
the findings can be checked after re-running some columns only.

Run it again after an interruption and it picks up where it stopped: a preset whose run has
results.json is done and skipped, one with checkpoints/last.ckpt is resumed, and the matrix
reuses the cells it has already computed.
"""
from __future__ import annotations

import argparse
import csv
import json
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from asr.core.exit_status import SUCCESS, run_command
from attention_ext import AttentionConfigError, parse_attention_spec
from attention_ext.comparisons import cross_matrix_rows, further_attentions

PRESETS = ("synth_full", "synth_shared_full", "synth_lsh1", "synth_lsh4", "synth_clustered",
           "synth_iclustered")
CLUSTERED_PRESETS = ("synth_clustered", "synth_iclustered")


@dataclass(frozen=True)
class Setting:
    """What one setting changes: asr.train overrides for every preset, the cluster count the
    clustered presets train with, and the matrix's two cluster counts (Table 1's 100 and 200)."""
    description: str
    overrides: tuple[str, ...]
    train_clusters: int
    small: int
    large: int
    steps: int

    @property
    def specs(self) -> tuple[str, ...]:
        """Table 1's rows, then this project's further linear-cost attentions (no finding rests on them;
        declared in attention_ext.comparisons)."""
        return cross_matrix_rows(self.small, self.large)

    def preset_overrides(self, preset: str) -> list[str]:
        clusters = [f"attention.clusters={self.train_clusters}"] if preset in CLUSTERED_PRESETS else []
        return [*self.overrides, *clusters]


SETTINGS = {
    # ~780 encoder positions: utterances twice as long (~16 s, `synth_corpus.utterance_scale=2`, generated
    # into their own folder on first use; 1500 of them are the same 6.5 hours as the 3000 of the short
    # setting) and the presets' stride-2 convolutional front end. The front end's local context is what
    # makes CTC leave its blank plateau early: with the paper's linear front end (no subsampling on the
    # ~8 s utterances) full attention was still at 54 % PER after 1500 steps (RESULTS.md). A batch holds
    # the same 60 s of audio as in the short setting, so a step costs the same linear layers and twice
    # the attention.
    "paper": Setting("the paper's length: ~780 encoder positions (16 s utterances, stride-2 front end), "
                     "100/200 clusters",
                     ("data.root=data/synth_x2", "synth_corpus.utterance_scale=2", "synth_corpus.train_utterances=1500",
                      "trainer.val_check_interval=200", "trainer.diagnostics_every_n_steps=50"),
                     train_clusters=100, small=100, large=200, steps=1500),
    "short": Setting("the synth presets: ~390 encoder positions, 32/64 clusters",
                     ("trainer.val_check_interval=200", "trainer.diagnostics_every_n_steps=50"),
                     train_clusters=64, small=32, large=64, steps=1600),
}
DEFAULT_SETTING = "paper"
SPECS = SETTINGS["short"].specs      # the rows of the short setting (the tests' hand-made matrix)
SMALL, LARGE = SETTINGS["short"].small, SETTINGS["short"].large


# ---- the paper's findings of sec. 4.1, checked on a matrix ------------------------------------------
def _per(matrix: dict, row: str, column: str) -> float | None:
    for line in matrix["rows"]:
        if line["evaluate_with"] == row:
            cell = line["cells"].get(column)
            return cell["per"] if cell and cell["valid"] else None
    return None


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{100 * value:.2f}"


def paper_findings(matrix: dict, small: int = SMALL, large: int = LARGE) -> list[dict]:
    """Each finding of the paper's sec. 4.1 with the comparisons it rests on, from a cross
    matrix (asr.cross_matrix's matrix.json) with the experiment's rows and columns.

    A finding holds when every one of its comparisons holds; comparisons whose cells are
    missing are left out (and listed as such). Columns are the preset names without "synth_".
    """
    columns = [column["label"] for column in matrix["columns"]]
    findings = []

    def finding(text: str, comparisons: list[tuple[str, bool | None]]) -> None:
        known = [ok for _, ok in comparisons if ok is not None]
        findings.append({"finding": text, "holds": bool(known) and all(known),
                         "held": sum(known), "compared": len(known),
                         "evidence": [line for line, _ in comparisons]})

    def less(a: tuple[str, str], b: tuple[str, str]) -> tuple[str, bool | None]:
        pa, pb = _per(matrix, *a), _per(matrix, *b)
        ok = None if pa is None or pb is None else pa < pb
        mark = {True: "yes", False: "NO", None: "missing"}[ok]
        return f"{a[1]} model: {a[0]} {_pct(pa)} < {b[0]} {_pct(pb)}: {mark}", ok

    def close(a: tuple[str, str], b: tuple[str, str]) -> tuple[str, bool | None]:
        pa, pb = _per(matrix, *a), _per(matrix, *b)
        ok = None if pa is None or pb is None else abs(pa - pb) <= CLOSE
        mark = {True: "yes", False: "NO", None: "missing"}[ok]
        return f"{a[1]} model: {a[0]} {_pct(pa)} within {100 * CLOSE:.0f} of {b[0]} {_pct(pb)}: {mark}", ok

    approximated = [c for c in ("full", "shared_full") if c in columns]
    finding("i-clustered approximates full and shared-full better than clustered",
            [less((f"i-clustered-{n}", c), (f"clustered-{n}", c)) for c in approximated for n in (small, large)])
    finding("more clusters approximate better (clustered and i-clustered rows)",
            [less((f"{kind}-{large}", c), (f"{kind}-{small}", c)) for c in columns
             for kind in ("clustered", "i-clustered")])
    lsh_checks = []
    if "shared_full" in columns:
        for lsh in ("lsh-1", "lsh-4"):
            lsh_checks.append(less((f"i-clustered-{large}", "shared_full"), (lsh, "shared_full")))
            lsh_checks.append(less(("shared-full", "shared_full"), (lsh, "shared_full")))
    finding("lsh cannot approximate a model trained with full attention (here: the shared-QK one, "
            "the only full model lsh can run on): lsh is worse than i-clustered and than exact attention",
            lsh_checks)
    finding("oracle-top (each query's 32 best keys) is worse than i-clustered",
            [less((f"i-clustered-{large}", c), ("oracle-top", c)) for c in columns])
    finding(f"a model trained with clustered or i-clustered attention stays close when evaluated with full "
            f"(within {100 * CLOSE:.0f} PER point of its own attention)",
            [close(("full", c), (_training_row(matrix, c), c)) for c in ("clustered", "iclustered")
             if c in columns])
    return findings


CLOSE = 0.01   # "stays close": the paper's 5.56 vs 5.95 and 7.10 vs 7.06 differ by < 0.4 points


def _training_row(matrix: dict, column: str) -> str:
    """The evaluate-with row that equals the column's training attention (its diagonal cell)."""
    for line in matrix["rows"]:
        if line["cells"].get(column, {}).get("same_as_training"):
            return line["evaluate_with"]
    return "(none)"


def format_findings(findings: list[dict]) -> str:
    lines = []
    for item in findings:
        verdict = "holds" if item["holds"] else "does not hold"
        lines.append(f"- **{item['finding']}**: {verdict} here ({item['held']} of {item['compared']} "
                     "comparisons, PER %)")
        lines += [f"  - {line}" for line in item["evidence"]]
    return "\n".join(lines) + "\n"


def train_preset(preset: str, run_dir: Path, budget: list[str], overrides: list[str]) -> int:
    """Trains (or resumes) one preset in run_dir with `python -m asr.train`; returns its exit status."""
    command = [sys.executable, "-m", "asr.train", f"conf={preset}", f"run_dir={run_dir}", *budget, *overrides]
    if (run_dir / "checkpoints" / "last.ckpt").is_file():
        command.append(f"ckpt_path={run_dir / 'checkpoints' / 'last.ckpt'}")
    print(f"[experiment] {' '.join(command[1:])}", flush=True)
    process = subprocess.Popen(command)
    try:
        return process.wait()
    except KeyboardInterrupt:
        process.wait()   # the same Ctrl-C reached asr.train: let it finish its own clean shutdown
        raise


def training_budget(steps: int | None, minutes: float | None) -> list[str]:
    """asr.train overrides of the budget: steps (the default, what comparisons need) or minutes."""
    if minutes is not None:
        return [f"trainer.max_minutes={minutes}", "trainer.max_steps=-1"]
    return ["trainer.max_minutes=null", f"trainer.max_steps={steps}", "trainer.max_epochs=-1"]


def best_checkpoint(run_dir: Path) -> Path:
    path = run_dir / "checkpoints" / "best.ckpt"
    if not path.is_file():
        raise SystemExit(f"recipes.synth.experiment: {run_dir} finished without checkpoints/best.ckpt; "
                         f"see {run_dir / 'train.log'}")
    return path


# ---- what the experiment keeps: results.json and the training curves ----------------------------------
def validation_curve(run_dir: Path) -> list[tuple[int, float]]:
    """(step, validation PER) of every validation of a run, over all its starts (logs/version_N)."""
    points = {}
    for metrics in sorted(run_dir.glob("logs/version_*/metrics.csv")):
        with open(metrics, newline="") as handle:
            for row in csv.DictReader(handle):
                if row.get("val/per"):
                    points[int(row["step"]) + 1] = float(row["val/per"])
    return sorted(points.items())


def training_spec(column: str, setting: Setting) -> str:
    """The attention spec a column's preset trains with (its diagonal row), e.g. iclustered ->
    i-clustered-100 in the paper setting."""
    clusters = setting.train_clusters
    return {"full": "full", "shared_full": "shared-full", "lsh1": "lsh-1", "lsh4": "lsh-4",
            "clustered": f"clustered-{clusters}", "iclustered": f"i-clustered-{clusters}"}.get(column, column)


def with_columns_from(matrix: dict, earlier: dict, source: str) -> dict:
    """The matrix with the columns of an earlier results.json that it lacks: those cells as they were
    (valid ones only, as results.json keeps them), each marked with `source`; the diagonal from the
    earlier run's setting."""
    setting = SETTINGS[earlier["setting"]]
    labels = [column["label"] for column in matrix["columns"]]
    borrowed = list(dict.fromkeys(cell["train"] for cell in earlier["matrix"] if cell["train"] not in labels))
    rows = {row["evaluate_with"]: row for row in matrix["rows"]}
    for cell in earlier["matrix"]:
        if cell["train"] in labels:
            continue
        row = rows.get(cell["evaluate"])
        if row is None:
            row = rows[cell["evaluate"]] = {"evaluate_with": cell["evaluate"], "cells": {}}
            matrix["rows"].append(row)
        row["cells"][cell["train"]] = {"valid": True, "per": cell["per"], "wer": cell["wer"],
                                       "forward_ms_per_utterance": cell["forward_ms_per_utterance"], "from": source,
                                       "same_as_training": cell["evaluate"] == training_spec(cell["train"], setting)}
    # the earlier run's column order (the findings list their comparisons in it), then any new column
    by_label = {column["label"]: column for column in matrix["columns"]}
    by_label.update({label: {"label": label, "from": source} for label in borrowed})
    order = list(dict.fromkeys([*(cell["train"] for cell in earlier["matrix"]), *labels]))
    matrix["columns"] = [by_label[label] for label in order if label in by_label]
    return matrix


def experiment_results(out: Path, presets: list[str], matrix: dict, setting: str) -> dict:
    """results.json: per preset its steps and test rates, and every matrix cell (with the file it came
    from where it is not this run's)."""
    results = {"setting": setting, "presets": {}, "matrix": []}
    for preset in presets:
        run = json.loads((out / preset / "results.json").read_text())
        test = run.get("test", {})
        results["presets"][preset.removeprefix("synth_")] = {
            "steps": run.get("steps"), "epochs": run.get("epochs"), "test_per": test.get("per"),
            "test_wer": test.get("wer"), "encoder_length": test.get("encoder_length"),
            "train_seconds": sum(epoch["train_seconds"] for epoch in run.get("epoch_times", []))}
    for row in matrix["rows"]:
        for column, cell in row["cells"].items():
            if cell["valid"]:
                results["matrix"].append({"train": column, "evaluate": row["evaluate_with"], "per": cell["per"],
                                          "wer": cell["wer"],
                                          "forward_ms_per_utterance": cell["forward_ms_per_utterance"],
                                          **({"from": cell["from"]} if "from" in cell else {})})
    return results


def plot_training_curves(out: Path, presets: list[str], path: Path) -> None:
    """Validation PER against training steps, one line per preset (did every model learn?)."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    figure, axis = plt.subplots(figsize=(7, 4.5))
    for preset in presets:
        curve = validation_curve(out / preset)
        if curve:
            axis.plot([step for step, _ in curve], [100 * per for _, per in curve], marker="o", markersize=3,
                      label=preset.removeprefix("synth_"))
    axis.set_xlabel("training step")
    axis.set_ylabel("validation PER (%)")
    axis.set_ylim(0, 105)
    axis.grid(alpha=0.3)
    axis.legend()
    figure.tight_layout()
    figure.savefig(path, dpi=120)
    plt.close(figure)


PUBLISHED = {"results.json": "results.json", "training_curves.png": "training_curves.png",
             "matrix/matrix.md": "matrix.md", "matrix/findings.md": "findings.md",
             "matrix/matrix_heatmap.png": "matrix_heatmap.png", "matrix/speed_accuracy.png": "speed_accuracy.png"}


def publish(out: Path, folder: Path) -> None:
    """Copies the experiment's results that RESULTS.md shows into `folder` (names in PUBLISHED)."""
    folder.mkdir(parents=True, exist_ok=True)
    for source, name in PUBLISHED.items():
        shutil.copyfile(out / source, folder / name)
    print(f"[experiment] copied {', '.join(PUBLISHED.values())} to {folder}", flush=True)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m recipes.synth.experiment", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--setting", choices=sorted(SETTINGS), default=DEFAULT_SETTING,
                        help=f"sequence length and cluster counts (default: {DEFAULT_SETTING})")
    parser.add_argument("--out", type=Path, default=None,
                        help="folder of the runs and the matrix (default: runs/synth_experiment_<setting>)")
    parser.add_argument("--presets", nargs="+", default=list(PRESETS), metavar="PRESET",
                        help="train-with presets, the matrix's columns (default: the six synth ones; add "
                             "synth_linear synth_agglomerative for columns of those, each one more training run)")
    parser.add_argument("--specs", nargs="+", default=None, metavar="SPEC",
                        help="evaluate-with attention specs, the rows (default: the setting's Table 1 rows, "
                             f"then {' and '.join(further_attentions())})")
    parser.add_argument("--steps", type=int, default=None,
                        help="training steps per preset (default: the setting's, "
                             + ", ".join(f"{name} {s.steps}" for name, s in SETTINGS.items()) + ")")
    parser.add_argument("--minutes", type=float, default=None,
                        help="a wall-clock budget per preset instead of --steps (not for comparisons: "
                             "a busy machine then decides how far each model gets)")
    parser.add_argument("--split", default="test", help="split the matrix is scored on (default: test)")
    parser.add_argument("--train-override", action="append", default=[], metavar="KEY=VALUE",
                        help="extra asr.train override for every preset (repeatable)")
    parser.add_argument("--threads", type=int, default=None,
                        help="torch threads of the matrix's evaluations (default: torch's; training's are "
                             "--train-override trainer.torch_threads=N)")
    parser.add_argument("--columns-from", type=Path, default=None, metavar="RESULTS_JSON",
                        help="complete the matrix and its findings with the columns of an earlier run's "
                             "results.json that this run does not train (e.g. recipes/synth/results.json)")
    parser.add_argument("--publish", type=Path, default=None, metavar="DIR",
                        help="also copy what is kept in the repository (results.json, matrix.md, findings.md, "
                             "the heatmap, the speed-accuracy plot, the training curves) into DIR, "
                             "e.g. recipes/synth")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)       # a bad option: argparse exits with USAGE_ERROR
    return run_command("recipes.synth.experiment", lambda: run_experiment(args),
                       usage_errors=(AttentionConfigError, ExperimentError),
                       resume_hint="run the same command again: trained presets are skipped, the interrupted "
                                   "one resumes from its last finished epoch, and computed matrix cells are reused")


class ExperimentError(ValueError):
    """An option the experiment cannot run with; the message says what to do."""


def read_earlier_results(path: Path) -> dict:
    """--columns-from's results.json, checked before any training."""
    try:
        earlier = json.loads(path.read_text())
        cells, setting = earlier["matrix"], earlier["setting"]
        if setting not in SETTINGS:
            raise KeyError(f"an unknown setting {setting!r}")
        if not all({"train", "evaluate", "per", "wer", "forward_ms_per_utterance"} <= set(cell) for cell in cells):
            raise KeyError("a cell's train, evaluate, per, wer or forward_ms_per_utterance")
    except (OSError, ValueError, KeyError, TypeError) as error:
        raise ExperimentError(f"--columns-from {path}: not a readable results.json of this experiment ({error}); "
                              "give the results.json an earlier run wrote (e.g. recipes/synth/results.json)") from None
    return earlier


def run_experiment(args: argparse.Namespace) -> int:
    """Trains the presets, builds the matrix and its findings; returns the exit status."""
    setting = SETTINGS[args.setting]
    out = args.out or Path(f"runs/synth_experiment_{args.setting}")
    specs = args.specs or list(setting.specs)
    for spec in specs:
        parse_attention_spec(spec)              # a bad row stops the experiment now, not after training
    earlier = read_earlier_results(args.columns_from) if args.columns_from else None
    if earlier is not None and earlier["setting"] != args.setting:
        raise ExperimentError(f"--columns-from {args.columns_from} holds the {earlier['setting']!r} setting's matrix; "
                              f"run with --setting {earlier['setting']} or give a results.json of {args.setting!r}")
    budget = training_budget(args.steps or setting.steps, args.minutes)
    print(f"[experiment] setting {args.setting}: {setting.description}; budget {' '.join(budget)}; into {out}",
          flush=True)
    started = time.perf_counter()
    checkpoints = []
    for preset in args.presets:
        run_dir = out / preset
        if (run_dir / "results.json").is_file():
            print(f"[experiment] {preset}: trained already ({run_dir / 'results.json'})", flush=True)
        else:
            status = train_preset(preset, run_dir, budget, [*setting.preset_overrides(preset), *args.train_override])
            if status != SUCCESS:
                print(f"recipes.synth.experiment: asr.train stopped on {preset} with exit status {status} "
                      "(its message is above)", file=sys.stderr)
                return status
        checkpoints.append(f"{preset.removeprefix('synth_')}={best_checkpoint(run_dir)}")
    from asr import cross_matrix
    threads = ["--threads", str(args.threads)] if args.threads else []
    code = cross_matrix.main([*checkpoints, "--specs", *specs, "--split", args.split,
                              "--out", str(out / "matrix"), *threads])
    if code != 0:
        return code
    matrix = json.loads((out / "matrix" / "matrix.json").read_text())
    if earlier is not None:
        matrix = with_columns_from(matrix, earlier, str(args.columns_from))
    findings = format_findings(paper_findings(matrix, setting.small, setting.large))
    (out / "matrix" / "findings.md").write_text(findings)
    results = experiment_results(out, args.presets, matrix, args.setting)
    if earlier is not None:       # the borrowed columns' training, as the earlier run recorded it
        for column in matrix["columns"]:
            if "from" in column and column["label"] in earlier.get("presets", {}):
                results["presets"][column["label"]] = {**earlier["presets"][column["label"]], "from": column["from"]}
    (out / "results.json").write_text(json.dumps(results, indent=2) + "\n")
    plot_training_curves(out, args.presets, out / "training_curves.png")
    if args.publish is not None:
        publish(out, args.publish)
    print(f"\nthe paper's sec. 4.1 findings on this matrix:\n{findings}")
    print(f"[experiment] done in {(time.perf_counter() - started) / 60:.1f} min; results.json, "
          f"training_curves.png in {out}, the matrix and findings.md in {out / 'matrix'}", flush=True)
    return SUCCESS


if __name__ == "__main__":
    sys.exit(main())

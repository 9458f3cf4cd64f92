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
import json
import sys
import time
from pathlib import Path

from asr.core.exit_status import SUCCESS, run_command
from attention_ext import AttentionConfigError, parse_attention_spec
from attention_ext.comparisons import further_attentions
from recipes.synth.experiment_results import experiment_results, plot_training_curves, publish, with_columns_from
from recipes.synth.experiment_settings import DEFAULT_SETTING, PRESETS, SETTINGS
from recipes.synth.paper_findings import format_findings, format_magnitudes, paper_findings, table1_magnitudes
from recipes.child_run import run_to_end


def train_preset(preset: str, run_dir: Path, budget: list[str], overrides: list[str]) -> int:
    """Trains (or resumes) one preset in run_dir with `python -m asr.train`; returns its exit status."""
    command = [sys.executable, "-m", "asr.train", f"conf={preset}", f"run_dir={run_dir}", *budget, *overrides]
    if (run_dir / "checkpoints" / "last.ckpt").is_file():
        command.append(f"ckpt_path={run_dir / 'checkpoints' / 'last.ckpt'}")
    print(f"[experiment] {' '.join(command[1:])}", flush=True)
    return run_to_end(command)


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
    if any(column["label"] == "full" for column in matrix["columns"]):
        findings += "\n" + format_magnitudes(table1_magnitudes(matrix, "full", setting.small, setting.large,
                                                                 matrix_folder=out / "matrix"))
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

"""Where the clustered-attention gap comes from: the paper's encoder beside the controls that change one
of its settings each, measured by recipes.synth.sharpening on every run's kept checkpoints.

    python -m recipes.synth.attribution --main runs/paper_encoder/sharpening \\
        --control "front end"=runs/paper_encoder_stride2/sharpening \\
        --control "layer form"=runs/paper_encoder_prenorm/sharpening --out recipes/synth/paper_encoder

Each folder is a `recipes.synth.sharpening --out` folder (its sharpening.json, and matrix/matrix.json for
Table 1's magnitudes), all measured on the same split with the same --limit. A control is named by
the setting in which it differs from the main run (README, "The paper's encoder to its plateau").
Each run's gap is its own probe's (sharpening's --probe, default clustered-100), so a control with
fewer positions can be measured at the main run's queries per cluster (the stride-2 control's ~395
positions with clustered-50 against the main run's ~790 with clustered-100) beside its clustered-100.

The attribution, for the probe's gap to full (PER points, at each run's last kept step, its plateau
when the runs have stopped):
    training length   the main run's gap at its last kept step minus at its first
    each control      the main run's gap minus the control's: the part of the gap that goes away when
                      only that setting changes (the same difference at the last step both kept is
                      printed beside it, so that a run trained longer is not what makes it)
and, per run and step, what the gap is read against: the mean over layers of the exact attention's
relative entropy, of its share within +-5 and +-20 positions, of the probe's cluster spread (a
fraction of the utterance's length) and of its clustering errors (the total variation between a
query's exact attention and its cluster centroid's, the relative change of its output, and that of
the layer's output), of the attention's share of each layer's output, and the largest gap with the
probe in one layer alone. The locality counts encoder positions: a position of the stride-2 control
is two 10-ms frames, so its +-5 spans twice the audio of the main run's; the spread, a fraction of
the length, compares as it is.

Writes to --out: attribution.json (every number above, per run and step), attribution.png (the gaps
of the probe and of i-clustered at the probe's cluster count, the locality and the cluster spread
against step, one line per run), attribution.md (the tables that are also printed).
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from asr.core.exit_status import SUCCESS, run_command
from recipes.synth.paper_findings import PAPER_FULL_COLUMN, format_magnitudes, table1_magnitudes
from recipes.synth.sharpening import REFERENCE_ROW

MAIN_LABEL = "main"
# What has to agree between the runs for their numbers to be compared (rows and probe may differ).
SETTINGS = ("split", "limit")


class AttributionError(ValueError):
    """A folder or option that cannot be compared; the message says what to do."""


def load_sharpening(folder: Path) -> dict:
    path = folder / "sharpening.json"
    if not path.is_file():
        raise AttributionError(f"{path} does not exist: run `python -m recipes.synth.sharpening --run RUN "
                               f"--out {folder}` on that run first")
    try:
        measured = json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as error:
        raise AttributionError(f"{path} is not a sharpening.json ({error}); run recipes.synth.sharpening again") from None
    if not isinstance(measured, dict) or not measured.get("points"):
        raise AttributionError(f"{path} holds no measured checkpoints; run recipes.synth.sharpening again")
    return measured


def _mean(values) -> float | None:
    known = [value for value in values if value is not None]
    return sum(known) / len(known) if known else None


def step_summary(point: dict, probe: str) -> dict:
    """One kept step of a run: full PER, every row's gap, and the layer measures averaged over the layers."""
    by_layer = point.get("gap_by_layer")
    worst = None
    if by_layer is not None and any(gap is not None for gap in by_layer):
        layer = max((index for index, gap in enumerate(by_layer) if gap is not None), key=lambda index: by_layer[index])
        worst = {"layer": layer, "gap": by_layer[layer]}
    layers = point["layers"]
    return {"step": point["step"], "full_per": point["per"][REFERENCE_ROW], "gap_to_full": point["gap_to_full"],
            "probe_gap": point["gap_to_full"].get(probe), "mean_entropy": point["mean_entropy"],
            **{f"mean_{name}": _mean(layer.get(name) for layer in layers)   # get: measures added later
               for name in ("locality5", "locality20", "cluster_spread_fraction", "clustering_error",
                            "clustering_output_error", "clustering_layer_error", "attention_share")},
            "largest_gap_in_one_layer": worst}


def _difference(a: float | None, b: float | None) -> float | None:
    return None if a is None or b is None else a - b


def attribute(runs: list[dict]) -> list[dict]:
    """The attribution of the probe's gap (runs[0] is the main run; see the module's doc). Gaps in
    fractions of PER (0.01 = 1 point); None where a gap is missing."""
    main = runs[0]
    first, last = main["steps"][0], main["steps"][-1]
    items = [{"factor": "training length",
              "compares": f"{MAIN_LABEL} ({main['probe']}) at step {last['step']} - at step {first['step']}",
              "gap_difference": _difference(last["probe_gap"], first["probe_gap"]), "at_common_step": None}]
    main_by_step = {step["step"]: step for step in main["steps"]}
    for control in runs[1:]:
        control_last = control["steps"][-1]
        common = [step for step in control["steps"] if step["step"] in main_by_step]
        at_common = None
        if common:
            step = common[-1]
            at_common = {"step": step["step"], "gap_difference": _difference(main_by_step[step["step"]]["probe_gap"],
                                                                             step["probe_gap"])}
        items.append({"factor": control["label"],
                      "compares": f"{MAIN_LABEL} ({main['probe']}) at step {last['step']} - {control['label']} "
                                  f"({control['probe']}) at step {control_last['step']}",
                      "gap_difference": _difference(last["probe_gap"], control_last["probe_gap"]),
                      "at_common_step": at_common})
    return items


def _points(value: float | None, form: str = "+.2f") -> str:
    return "-" if value is None else format(100 * value, form)


def _plain(value: float | None, form: str = ".3f") -> str:
    return "-" if value is None else format(value, form)


def format_runs(runs: list[dict]) -> str:
    """A markdown table: each run at each kept step, a column per row any run measured."""
    others = list(dict.fromkeys(row for run in runs for row in run["rows"] if row != REFERENCE_ROW))
    lines = ["| run | probe | step | full PER | " + " | ".join(f"{row} gap" for row in others)
             + " | mean entropy | within +-5 | within +-20 | probe's cluster spread / length | clustering error | "
               "output error | layer error | attention share | largest gap, the probe in one layer |",
             "|---|---|---:|---:|" + "---:|" * len(others) + "---:|---:|---:|---:|---:|---:|---:|---:|---|"]
    for run in runs:
        for step in run["steps"]:
            worst = step["largest_gap_in_one_layer"]
            lines.append(f"| {run['label']} | {run['probe']} | {step['step']} | {_points(step['full_per'], '.2f')} | "
                         + " | ".join(_points(step["gap_to_full"].get(row)) for row in others)
                         + f" | {_plain(step['mean_entropy'])} | {_plain(step['mean_locality5'])} | "
                           f"{_plain(step['mean_locality20'])} | {_plain(step['mean_cluster_spread_fraction'])} | "
                           f"{_plain(step['mean_clustering_error'])} | {_plain(step['mean_clustering_output_error'])} | "
                           f"{_plain(step['mean_clustering_layer_error'])} | {_plain(step['mean_attention_share'])} | "
                           f"{'-' if worst is None else _points(worst['gap']) + ' (layer ' + str(worst['layer']) + ')'} |")
    return "\n".join(lines) + "\n"


def format_attribution(items: list[dict]) -> str:
    lines = ["The probe's gap to full, attributed (PER points; the part of the main run's gap that goes away "
             "when only that changes)", "", "| factor | compares | difference | at the last step both kept |",
             "|---|---|---:|---:|"]
    for item in items:
        common = item["at_common_step"]
        lines.append(f"| {item['factor']} | {item['compares']} | {_points(item['gap_difference'])} | "
                     f"{'-' if common is None else _points(common['gap_difference']) + ' (step ' + str(common['step']) + ')'} |")
    return "\n".join(lines) + "\n"


def plot(runs: list[dict], path: Path) -> None:
    """2 x 2 panels against step, one line per run: its probe's gap, the gap of i-clustered at the probe's
    cluster count, the mean locality within +-5 (solid) and +-20 (dashed), the mean cluster spread."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    figure, axes = plt.subplots(2, 2, figsize=(11, 7), sharex=True)
    colours = plt.get_cmap("tab10")
    for index, run in enumerate(runs):
        steps = [step["step"] for step in run["steps"]]
        colour = colours(index)
        for axis, row in ((axes[0][0], run["probe"]), (axes[0][1], companion_row(run["rows"], run["probe"]))):
            if row is not None:
                axis.plot(steps, [None if step["gap_to_full"].get(row) is None else 100 * step["gap_to_full"][row]
                                  for step in run["steps"]], marker="o", color=colour, label=f"{run['label']}: {row}")
        for name, style in (("mean_locality5", "-"), ("mean_locality20", "--")):
            axes[1][0].plot(steps, [step[name] for step in run["steps"]], linestyle=style, marker=".", color=colour,
                            label=run["label"] if style == "-" else None)
        axes[1][1].plot(steps, [step["mean_cluster_spread_fraction"] for step in run["steps"]], marker=".",
                        color=colour, label=run["label"])
    for axis, title in ((axes[0][0], "the probe's PER gap to full (points)"),
                        (axes[0][1], "i-clustered at the probe's cluster count: PER gap to full (points)")):
        axis.axhline(0.0, color="gray", linewidth=0.8)
        axis.set_title(title, fontsize=10)
    axes[1][0].set_ylim(0, 1.02)
    axes[1][0].set_title("attention within +-5 (solid) and +-20 (dashed) positions, mean over layers", fontsize=10)
    axes[1][1].axhline(12 ** -0.5, color="gray", linestyle=":", linewidth=1, label="spread evenly")
    axes[1][1].set_ylim(bottom=0)
    axes[1][1].set_title("the probe's cluster spread / length, mean over layers", fontsize=10)
    for axis in (axes[1][0], axes[1][1]):
        axis.set_xlabel("training step")
    for axis in axes.flat:
        axis.grid(alpha=0.3)
        axis.legend(fontsize=8, loc="best")
    figure.tight_layout()
    figure.savefig(path, dpi=120)
    plt.close(figure)


def companion_row(rows: list[str], probe: str) -> str | None:
    """The i-clustered row with the probe's cluster count (clustered-100 -> i-clustered-100), if measured."""
    if not probe.startswith("clustered-"):
        return None
    row = "i-" + probe
    return row if row in rows else None


def parse_control(text: str) -> tuple[str, Path]:
    label, separator, folder = text.partition("=")
    if not separator or not label or not folder:
        raise AttributionError(f"--control {text!r}: give SETTING=FOLDER, e.g. \"front end\"=runs/paper_encoder_stride2/sharpening")
    if label == MAIN_LABEL:
        raise AttributionError(f"--control {text!r}: {MAIN_LABEL!r} names the --main run; name the setting the control changes")
    return label, Path(folder)


def compare(args: argparse.Namespace) -> int:
    folders = [(MAIN_LABEL, args.main), *(parse_control(text) for text in args.control)]
    labels = [label for label, _ in folders]
    if len(set(labels)) != len(labels):
        raise AttributionError(f"--control names repeat ({', '.join(labels[1:])}): give each control its own name")
    measured = [(label, folder, load_sharpening(folder)) for label, folder in folders]
    reference = measured[0][2]
    for label, folder, other in measured[1:]:
        differing = [name for name in SETTINGS if other.get(name) != reference.get(name)]
        if differing:
            raise AttributionError(
                f"{folder / 'sharpening.json'} was measured with other {', '.join(differing)} than {args.main} ("
                + "; ".join(f"{name} {other.get(name)} against {reference.get(name)}" for name in differing)
                + "): run recipes.synth.sharpening on both with the same options")
    runs = [{"label": label, "folder": str(folder), "run": data["run"], "rows": data["rows"], "probe": data["probe"],
             "steps": [step_summary(point, data["probe"]) for point in data["points"]]}
            for label, folder, data in measured]
    items = attribute(runs)
    text = "\n".join([format_runs(runs), format_attribution(items)])
    matrix = args.main / "matrix" / "matrix.json"
    if all(row in reference["rows"] for row in PAPER_FULL_COLUMN) and matrix.is_file():
        text += "\n" + format_magnitudes(table1_magnitudes(json.loads(matrix.read_text()),
                                                           f"step{runs[0]['steps'][-1]['step']}",
                                                           matrix_folder=matrix.parent))
    args.out.mkdir(parents=True, exist_ok=True)
    result = {"split": reference["split"], "limit": reference["limit"], "runs": runs, "attribution": items}
    (args.out / "attribution.json").write_text(json.dumps(result, indent=2) + "\n")
    (args.out / "attribution.md").write_text(text)
    plot(runs, args.out / "attribution.png")
    print(text)
    print(f"[attribution] wrote {args.out}/attribution.json, attribution.md and attribution.png", flush=True)
    return SUCCESS


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m recipes.synth.attribution", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--main", type=Path, required=True,
                        help="the main run's recipes.synth.sharpening folder (its sharpening.json)")
    parser.add_argument("--control", action="append", default=[], metavar="SETTING=FOLDER",
                        help="a control run's sharpening folder, named by the setting it changes (repeatable)")
    parser.add_argument("--out", type=Path, required=True, help="folder for attribution.json, .md and .png")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return run_command("recipes.synth.attribution", lambda: compare(args), usage_errors=(AttributionError,))


if __name__ == "__main__":
    sys.exit(main())

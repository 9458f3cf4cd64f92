"""What ``recipes.synth.experiment`` keeps: results.json (with an earlier run's columns, --columns-from),
the training curves, and the copies RESULTS.md shows (--publish)."""
from __future__ import annotations

import csv
import json
import shutil
from pathlib import Path

from recipes.synth.experiment_settings import SETTINGS, training_spec


def validation_curve(run_dir: Path) -> list[tuple[int, float]]:
    """(step, validation PER) of every validation of a run, over all its starts (logs/version_N)."""
    points = {}
    for metrics in sorted(run_dir.glob("logs/version_*/metrics.csv")):
        with open(metrics, newline="") as handle:
            for row in csv.DictReader(handle):
                if row.get("val/per"):
                    points[int(row["step"]) + 1] = float(row["val/per"])
    return sorted(points.items())

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

"""The clustered-attention gap against how sharp and how local the attention is, layer by layer.

    python -m recipes.synth.sharpening --run runs/sharpening_full --train 6000   # train (or resume), then measure
    python -m recipes.synth.sharpening --run RUN_DIR                             # measure a run that kept checkpoints
    python -m recipes.synth.sharpening --run RUN_DIR --by-layer                  # also the gap by layer
    python -m recipes.synth.sharpening --run RUN_DIR --steps 2000 4000           # only these kept checkpoints
    python -m recipes.synth.sharpening --run RUN_DIR --publish recipes/synth     # also copy the JSON and PNGs there
    python -m recipes.synth.sharpening --run runs/sharpening_wsj --train 2000 --architecture wsj

The question: RESULTS.md explains the small clustered-attention gap of the paper-length matrix by
attention that is still nearly flat. Here, for every checkpoint a run kept at a fixed step
(checkpoints/step-NNNNNN.ckpt, `asr.train trainer.keep_checkpoints_every_n_steps=N`):

    PER       the model evaluated with every row (default: full, clustered-100, clustered-200,
              i-clustered-100, i-clustered-200, oracle-top) on the split; the gap of a row is its
              PER minus full attention's, in points
    per layer, on the split's utterances (all, or the first --limit batches) with exact attention in
              every layer (asr.model.diagnostics.layer_attention_measures):
    entropy   the exact attention's entropy divided by that of uniform attention over the keys each
              query sees, averaged over the queries and heads; its mean over the layers is the
              first plot's second axis
    locality  the share of each query's exact attention mass on the keys within +-5 and within +-20
              encoder positions of it, averaged over the queries and heads
    query similarity
              the mean cosine similarity between the queries of two different positions of an
              utterance, averaged over the utterances and heads (near 1: the states have collapsed
              towards one vector, and every position asks the same)
    cluster spread
              the query clusters of --probe (default clustered-100), computed by the attention's own
              clustering with the random draws an evaluation of that batch makes when the probe runs
              in that layer alone: per cluster the standard deviation of its queries' positions, in
              positions and divided by the utterance's length, averaged over the clusters weighted by
              their size (0.29 of the length is a cluster spread evenly over the utterance)
    clustering error
              on the same clusters, the total variation distance between each query's exact
              attention and its cluster centroid's (what the probe gives it when it is clustered
              attention), averaged over the queries: 0 when clustering changes no weight, 1 when
              every query's weights move to keys it did not attend to; and the output error: the
              norm of the change of the query's attention output (weights x values) divided by the
              norm of its exact output, averaged over the queries
    layer error
              on the same clusters, the relative change of the layer's output (after its residual,
              feed-forward block and norms) when its attention output is the clustered one, its input
              the same, averaged over the positions: how much of the output error reaches the next layer
    attention share
              the norm of what the exact attention adds to the residual stream (after the output
              projection) divided by the norm of the layer's input, averaged over the positions: how
              much of the layer's output the attention makes at all
    gap by layer (--by-layer)
              PER with --probe in that layer alone and exact attention in the others, minus full's

--train STEPS first trains the paper-length full preset into --run (the synth_full preset with the
paper setting's overrides of recipes.synth.experiment: ~780 encoder positions, validation every 200
steps, diagnostics every 50) for STEPS optimiser steps, keeping a checkpoint every --every steps;
run it again after an interruption and it resumes from the run's last checkpoint (ckpt_path=last),
or trains further when STEPS grew. --architecture wsj trains the paper's WSJ encoder instead of the
synth one (supplementary C.3: 9 layers, 6 heads x 32 dims, feed-forward 768; 4.15 M parameters against 1.29 M),
keeping the synth front end's stride 2 so that the length stays the paper's (~780 positions; the
WSJ model's own front end has no stride, and this corpus's 15 s utterances would give ~1,480).

Writes to --out (default: <run>/sharpening/); a run started again reuses what is there, so an
interrupted measurement resumes where it stopped:
    matrix/               asr.cross_matrix of the kept checkpoints (columns step<N>) x the rows: one
                          cell file per evaluation, reused while the checkpoint is unchanged
    layers/step<N>.json   the measures per layer of one checkpoint, reused the same way
    by_layer/step<N>.json --by-layer: PER with the probe in each layer alone, written after every layer
    sharpening.json       per step: PER per row and gap to full with its 95 % interval over the
                          utterances (gap_interval: a paired bootstrap of the cells' hypotheses), the
                          entropy per layer and its mean, per layer the measures and the gap by layer
                          (null where not measured)
    sharpening.png        PER gap to full against step, one line per row, the intervals as error bars;
                          mean normalised entropy on a second axis
    sharpening_layers.png per layer against step: the gap with the probe in that layer alone (with
                          --by-layer), the locality, the cluster spread, the clustering errors,
                          the attention share
and prints the tables, and Table 1's magnitudes for the last step beside the paper's, each gap with
its interval (recipes.synth.paper_findings.table1_magnitudes) where the rows are the default ones.
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
from recipes.synth.paper_findings import PAPER_FULL_COLUMN, format_magnitudes, gap_interval, table1_magnitudes

ROWS = ("full", "clustered-100", "clustered-200", "i-clustered-100", "i-clustered-200", "oracle-top")
REFERENCE_ROW = "full"
PROBE = "clustered-100"      # whose clusters are measured, and which runs in one layer at a time (--by-layer)
CLUSTERING_ATTENTIONS = ("clustered", "iclustered")
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


def chosen_checkpoints(kept: dict[int, Path], steps: list[int] | None, run: Path) -> dict[int, Path]:
    """The kept checkpoints of --steps (all of them without it); a step the run did not keep is an error."""
    if steps is None:
        return kept
    missing = sorted(set(steps) - set(kept))
    if missing:
        raise SharpeningError(f"--steps {' '.join(map(str, missing))}: {run}/checkpoints keeps no such step; it "
                              f"keeps {', '.join(map(str, kept))}")
    return {step: kept[step] for step in sorted(set(steps))}


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


# ---- the attention's measures per checkpoint ----------------------------------------------------------------
MEASURES = ("entropy", "locality5", "locality20", "query_similarity", "attention_share", "cluster_spread",
            "cluster_spread_fraction", "clustering_error", "clustering_output_error", "clustering_layer_error")


def exact_model(checkpoint: Path):
    """The checkpoint's model with exact attention in every layer (full; after shared_full or lsh in the
    Reformer key form the model learned, as the matrix's full row)."""
    from asr.evaluation.attention_choice import evaluation_attention, set_evaluation_attention
    from asr.evaluation.evaluation import load_model
    model = load_model(checkpoint)
    set_evaluation_attention(model, evaluation_attention(model, REFERENCE_ROW), "trained")
    return model


def checkpoint_measures(checkpoint: Path, split: str, limit: int | None, probe: str) -> dict:
    """Per layer of the checkpoint's model with exact attention, on `split` (first `limit` batches):
    the mean relative entropy, the locality (share of attention within +-5 and +-20 positions) and the
    time spread of the probe's query clusters (asr.model.diagnostics.layer_attention_measures), each
    batch's clustering seeded as asr.evaluate seeds that batch."""
    import torch
    from asr.evaluation.evaluation_data import evaluation_data
    from asr.model.diagnostics import layer_attention_measures
    from asr.model.recognizer import EVALUATION_SEED, seed_evaluation_batch
    model = exact_model(checkpoint)
    clustering = parse_attention_spec(probe).options
    data = evaluation_data(model, checkpoint, split, progress=False)
    totals: list[dict[str, list[float]]] = []
    with torch.no_grad():
        for index, batch in enumerate(data.datamodule.dataloader(data.split)):
            if limit is not None and index >= limit:
                break
            seed_evaluation_batch(EVALUATION_SEED, index)
            sums = layer_attention_measures(model, batch["features"], batch["feature_lengths"], clustering,
                                            reseed=lambda index=index: seed_evaluation_batch(EVALUATION_SEED, index))
            totals = totals or [{name: [0.0, 0] for name in layer} for layer in sums]
            for total, layer in zip(totals, sums):
                for name, (value, count) in layer.items():
                    total[name][0] += value
                    total[name][1] += count
    layers = [{name: value / count if count else None for name, (value, count) in total.items()} for total in totals]
    entropies = [layer["entropy"] for layer in layers if layer["entropy"] is not None]
    return {"layers": layers, "mean_entropy": sum(entropies) / len(entropies) if entropies else None,
            "queries_per_layer": int(totals[0]["entropy"][1]) if totals else 0}


def _write_json(path: Path, value: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    temporary = path.with_suffix(".json.tmp")
    temporary.write_text(json.dumps(value, indent=2) + "\n")
    temporary.replace(path)              # a file that exists is complete


def _cached(path: Path, key: dict) -> dict | None:
    """The JSON at `path` when it was computed with `key` (checkpoint identity and settings), else None."""
    if not path.is_file():
        return None
    cached = json.loads(path.read_text())
    return cached if {name: cached.get(name) for name in key} == key else None


def measurement_key(checkpoint: Path, split: str, limit: int | None, probe: str) -> dict:
    from asr.evaluation.attention_matrix import checkpoint_identity
    return {"checkpoint": checkpoint_identity(checkpoint), "split": split, "limit": limit, "probe": probe}


def cached_measures(out: Path, step: int, checkpoint: Path, split: str, limit: int | None, probe: str) -> dict:
    """checkpoint_measures, kept in out/layers/step<N>.json while the checkpoint, settings and the measures
    taken are the same (a file without a measure added since is measured again)."""
    path = out / "layers" / f"step{step}.json"
    key = {**measurement_key(checkpoint, split, limit, probe), "measures": list(MEASURES)}
    cached = _cached(path, key)
    if cached is not None:
        return cached
    measures = {**key, **checkpoint_measures(checkpoint, split, limit, probe)}
    _write_json(path, measures)
    return measures


def cached_gap_by_layer(out: Path, step: int, checkpoint: Path, split: str, limit: int | None, probe: str,
                        progress) -> list[float | None]:
    """PER of the checkpoint's model with the probe attention in one layer at a time, exact attention
    (the matrix's full row) in the others, evaluated as asr.cross_matrix evaluates a cell; kept in
    out/by_layer/step<N>.json after every layer, so an interrupted measurement resumes at its next layer."""
    path = out / "by_layer" / f"step{step}.json"
    key = measurement_key(checkpoint, split, limit, probe)
    done = _cached(path, key) or {**key, "layers": None, "per_by_layer": []}
    per = done["per_by_layer"]
    if done["layers"] is not None and len(per) >= done["layers"]:
        return per
    from asr.evaluation.attention_choice import evaluation_attention, set_evaluation_attention
    from asr.evaluation.evaluation_data import evaluation_data
    from asr.evaluation.split_decoding import decode_split
    model = exact_model(checkpoint)
    exact, probed = evaluation_attention(model, REFERENCE_ROW), evaluation_attention(model, probe)
    data = evaluation_data(model, checkpoint, split, progress=False)
    done["layers"] = len(model.encoder.layers)
    for layer in range(len(per), done["layers"]):
        set_evaluation_attention(model, exact, "trained")
        set_evaluation_attention(model, probed, "trained", layers=[layer])
        per.append(decode_split(model, data, "greedy", limit=limit, progress=False).rates.get("per"))
        _write_json(path, done)
        progress(f"step {step}: {probe} in layer {layer} alone ({layer + 1}/{done['layers']}), the others "
                 f"{REFERENCE_ROW}: PER {'-' if per[-1] is None else format(100 * per[-1], '.2f')}")
    return per


# ---- the curve ------------------------------------------------------------------------------------------
def sharpening_points(matrix: dict, measures: dict[int, dict], rows: list[str],
                      per_by_layer: dict[int, list[float | None]] | None = None,
                      matrix_folder: Path | None = None) -> list[dict]:
    """Per kept step: PER per row and each row's gap to full, the entropy, and per layer its measures
    (checkpoint_measures) and, where measured, the PER and gap to full with the probe in that layer
    alone (gap_by_layer; None when not measured). PER and gaps are fractions (0.01 = 1 point). With
    `matrix_folder` (the matrix's --out, which keeps each cell's hypotheses), gap_interval gives each
    row's 95 % paired-bootstrap interval over the utterances (phone_gap_interval; None where the
    hypotheses cannot give it)."""
    cells = {(row["evaluate_with"], label): cell for row in matrix["rows"] for label, cell in row["cells"].items()}
    points = []
    for step, measured in sorted(measures.items()):
        per = {row: cells[row, f"step{step}"]["per"] for row in rows}
        reference = per[REFERENCE_ROW]

        def gap_of(value):
            return None if value is None or reference is None else value - reference

        by_layer = (per_by_layer or {}).get(step)
        layers = [{"layer": index, **{name: layer.get(name) for name in MEASURES}} for index, layer
                  in enumerate(measured["layers"])]
        gaps = {row: gap_of(value) for row, value in per.items() if row != REFERENCE_ROW}
        intervals = None
        if matrix_folder is not None:
            intervals = {row: gap_interval(matrix_folder, f"step{step}", row)[0] if gap is not None else None
                         for row, gap in gaps.items()}
        points.append({"step": step, "entropy_per_layer": [layer["entropy"] for layer in layers],
                       "mean_entropy": measured["mean_entropy"], "per": per,
                       "gap_to_full": gaps, "gap_interval": intervals,
                       "layers": layers, "per_by_layer": by_layer,
                       "gap_by_layer": None if by_layer is None else [gap_of(value) for value in by_layer]})
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
        intervals = [(point.get("gap_interval") or {}).get(row) for point in points]
        if all(interval is not None for interval in intervals):   # error bars: the interval over the utterances
            below = [gap - 100 * interval[0] for gap, interval in zip(gaps, intervals)]
            above = [100 * interval[1] - gap for gap, interval in zip(gaps, intervals)]
            axis.errorbar(steps, gaps, yerr=[below, above], marker=markers[index % len(markers)], capsize=3,
                          label=row)
        else:
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


def plot_layers(points: list[dict], probe: str, title: str, path: Path) -> None:
    """Per layer against step: the PER gap to full with the probe in that layer alone (beside the probe
    in every layer), the locality within +-5 and +-20 positions, the probe's cluster spread, the
    clustering errors and the attention's share of each layer's output."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    steps = [point["step"] for point in points]
    count = len(points[0]["layers"])
    colours = plt.get_cmap("viridis")([index / max(1, count - 1) * 0.9 for index in range(count)])
    by_layer = any(point["gap_by_layer"] is not None for point in points)
    panels = 5 if by_layer else 4
    figure, axes = plt.subplots(panels, 1, figsize=(8, 3.2 * panels), sharex=True)

    def points_of(values):
        return [None if value is None else 100 * value for value in values]

    axis = axes[0]
    if by_layer:
        for layer in range(count):
            axis.plot(steps, points_of(None if point["gap_by_layer"] is None else point["gap_by_layer"][layer]
                                       for point in points), marker="o", markersize=3, color=colours[layer],
                      label=f"layer {layer} alone")
        if probe in points[0]["gap_to_full"]:
            axis.plot(steps, points_of(point["gap_to_full"][probe] for point in points), color="black",
                      linewidth=2, marker="s", label="every layer")
        axis.axhline(0.0, color="gray", linewidth=0.8)
        axis.set_ylabel(f"PER gap to full, {probe} (points)")
        axis.legend(fontsize=7, ncol=2, loc="best")
        axis.grid(alpha=0.3)
        axis = axes[1]
    for layer in range(count):
        for name, style in (("locality5", "-"), ("locality20", "--")):
            axis.plot(steps, [point["layers"][layer][name] for point in points], linestyle=style, marker=".",
                      color=colours[layer], label=f"layer {layer}" if name == "locality5" else None)
    axis.set_ylim(0, 1.02)
    axis.set_ylabel("attention within +-5 (solid)\nand +-20 (dashed) positions")
    axis.legend(fontsize=7, ncol=2, loc="best")
    axis.grid(alpha=0.3)
    axis = axes[-3]
    for layer in range(count):
        axis.plot(steps, [point["layers"][layer]["cluster_spread_fraction"] for point in points], marker=".",
                  color=colours[layer], label=f"layer {layer}")
    axis.axhline(12 ** -0.5, color="gray", linestyle=":", linewidth=1, label="spread evenly over the utterance")
    axis.legend(fontsize=7, ncol=2, loc="lower right")
    axis.set_ylim(bottom=0)
    axis.set_ylabel(f"{probe} cluster spread\n(std of positions / length)")
    axis.grid(alpha=0.3)
    axis = axes[-2]
    for layer in range(count):
        for name, style in (("clustering_error", "-"), ("clustering_output_error", "--"), ("clustering_layer_error", ":")):
            axis.plot(steps, [point["layers"][layer][name] for point in points], linestyle=style, marker=".",
                      color=colours[layer], label=f"layer {layer}" if name == "clustering_error" else None)
    axis.legend(fontsize=7, ncol=2, loc="best")
    axis.set_ylim(bottom=0)
    axis.set_ylabel(f"{probe} against exact: weights (TV, solid),\nattention output (dashed), layer output\n"
                    "(dotted; relative changes)")
    axis.grid(alpha=0.3)
    axis = axes[-1]
    for layer in range(count):
        axis.plot(steps, [point["layers"][layer]["attention_share"] for point in points], marker=".",
                  color=colours[layer], label=f"layer {layer}")
    axis.legend(fontsize=7, ncol=2, loc="best")
    axis.set_ylim(bottom=0)
    axis.set_ylabel("attention's update /\nlayer input (norms)")
    axis.set_xlabel("training step")
    axis.grid(alpha=0.3)
    axes[0].set_title(title, fontsize=10)
    figure.tight_layout()
    figure.savefig(path, dpi=120)
    plt.close(figure)


def measure(args: argparse.Namespace) -> int:
    """Evaluates and measures every kept checkpoint (reusing what is cached); writes the JSON and PNGs;
    returns the exit status."""
    out = args.out or args.run / "sharpening"
    checkpoints = chosen_checkpoints(kept_checkpoints(args.run), args.steps, args.run)
    from asr import cross_matrix
    argv = [*(f"step{step}={path}" for step, path in checkpoints.items()), "--specs", *args.rows,
            "--split", args.split, "--out", str(out / "matrix")]
    if args.limit is not None:
        argv += ["--limit", str(args.limit)]
    if args.threads is not None:     # for the evaluations (asr.cross_matrix runs in this process) and the measures
        import torch
        torch.set_num_threads(args.threads)
    code = cross_matrix.main(argv)
    if code != SUCCESS:
        return code                     # asr.cross_matrix has said why
    matrix = json.loads((out / "matrix" / "matrix.json").read_text())

    def progress(line: str) -> None:
        print(f"[sharpening] {line}", flush=True)

    measures, per_by_layer = {}, {}
    for number, (step, path) in enumerate(checkpoints.items(), 1):
        measures[step] = cached_measures(out, step, path, args.split, args.limit, args.probe)
        progress(f"step {step} ({number}/{len(checkpoints)}): mean normalised attention entropy "
                 f"{measures[step]['mean_entropy']:.3f}")
        if args.by_layer:
            per_by_layer[step] = cached_gap_by_layer(out, step, path, args.split, args.limit, args.probe, progress)
    result = {"run": str(args.run), "split": matrix["split"], "rows": args.rows, "limit": args.limit,
              "probe": args.probe,
              "points": sharpening_points(matrix, measures, args.rows, per_by_layer, matrix_folder=out / "matrix")}
    (out / "sharpening.json").write_text(json.dumps(result, indent=2) + "\n")
    title = f"{args.run.name} ({matrix['split']} split)"
    plot(result["points"], args.rows, f"{args.run.name}: PER gap to full attention as the attention sharpens "
                                      f"({matrix['split']} split)", out / "sharpening.png")
    plot_layers(result["points"], args.probe, f"{title}: by layer", out / "sharpening_layers.png")
    if args.publish is not None:
        args.publish.mkdir(parents=True, exist_ok=True)
        stem = published_stem(args.run, out)
        for name, suffix in (("sharpening", ".json"), ("sharpening", ".png"), ("sharpening_layers", ".png")):
            shutil.copyfile(out / f"{name}{suffix}", args.publish / f"{stem}{name.removeprefix('sharpening')}{suffix}")
        print(f"[sharpening] copied {stem}.json, .png and _layers.png to {args.publish}", flush=True)
    print(format_table(result["points"], args.rows))
    print(format_layer_tables(result["points"], args.probe))
    last = result["points"][-1]["step"]
    if all(row in args.rows for row in PAPER_FULL_COLUMN):
        print(format_magnitudes(table1_magnitudes(matrix, f"step{last}", matrix_folder=out / "matrix")))
    print(f"[sharpening] wrote {out}/sharpening.json, sharpening.png and sharpening_layers.png", flush=True)
    return SUCCESS


def published_stem(run: Path, out: Path | None = None) -> str:
    """--publish's file name: sharpening_<run folder name>, or the folder's name if it starts so; an
    --out folder other than the default's name adds its own (less a leading "sharpening"), so that a
    run measured twice, e.g. with other rows into <run>/sharpening50, publishes both."""
    stem = run.name if run.name.startswith("sharpening") else f"sharpening_{run.name}"
    if out is not None and out.name != "sharpening":
        stem += "_" + (out.name.removeprefix("sharpening").lstrip("_-") or out.name)
    return stem


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


def format_layer_tables(points: list[dict], probe: str) -> str:
    """Per step, a markdown table of the layers: entropy, locality, the probe's cluster spread, and the PER
    gap with the probe in that layer alone."""
    def number(value, scale=1.0, form=".3f"):
        return "-" if value is None else format(scale * value, form)

    blocks = []
    for point in points:
        lines = [f"step {point['step']}: per layer (exact attention; {probe} clusters; gap with {probe} in the "
                 "layer alone, the others full, points)", "",
                 "| layer | entropy | within +-5 | within +-20 | query similarity | attention share "
                 "| cluster spread (positions) | spread / length | clustering error | output error | layer error "
                 "| gap alone |",
                 "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
        for layer in point["layers"]:
            gap = None if point["gap_by_layer"] is None else point["gap_by_layer"][layer["layer"]]
            lines.append(f"| {layer['layer']} | {number(layer['entropy'])} | {number(layer['locality5'])} | "
                         f"{number(layer['locality20'])} | {number(layer['query_similarity'])} | "
                         f"{number(layer['attention_share'])} | {number(layer['cluster_spread'], form='.1f')} | "
                         f"{number(layer['cluster_spread_fraction'])} | {number(layer['clustering_error'])} | "
                         f"{number(layer['clustering_output_error'])} | {number(layer['clustering_layer_error'])} | "
                         f"{number(gap, 100, '+.2f')} |")
        blocks.append("\n".join(lines) + "\n")
    return "\n".join(blocks)


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
    parser.add_argument("--probe", default=PROBE, metavar="SPEC",
                        help=f"the clustered or i-clustered attention whose query clusters are measured and that "
                             f"--by-layer runs in one layer at a time (then one of --rows; default: {PROBE})")
    parser.add_argument("--by-layer", action="store_true",
                        help="also the gap by layer: PER with --probe in one layer at a time, the others full "
                             "(one evaluation per layer and checkpoint)")
    parser.add_argument("--steps", type=int, nargs="+", default=None, metavar="STEP",
                        help="only the kept checkpoints of these steps (default: every one the run kept)")
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
    if parse_attention_spec(args.probe).name not in CLUSTERING_ATTENTIONS:
        raise SharpeningError(f"--probe {args.probe}: its query clusters are measured; give a clustered or "
                              "i-clustered spec, e.g. clustered-100")
    if args.by_layer and args.probe not in args.rows:
        raise SharpeningError(f"--by-layer compares --probe {args.probe} in one layer with it in every layer; "
                              "add it to --rows")
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
                                   "the evaluations and measures computed so far are reused")


if __name__ == "__main__":
    sys.exit(main())

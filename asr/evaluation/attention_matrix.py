"""The train-with x evaluate-with matrix (Table 1 of the paper): the library behind
`python -m asr.cross_matrix` (whose docstring describes the files it writes).

Columns are trained models, rows evaluate-with attention specs; `run` evaluates every missing cell
(`compute_column`: one model loaded once, each row's attention swapped in, asr.evaluation.evaluation's
`decode_split`), keeps each cell as a file so a started-again run reuses it, and writes the tables
(`format_markdown`, `write_csv`) and the pictures (`plot`, `plot_speed_accuracy`).
"""
from __future__ import annotations

import argparse
import csv
import json
import math
import os
import sys
from dataclasses import dataclass
from pathlib import Path

import torch

from asr.evaluation.evaluation import check_device, load_model, write_outputs
from asr.core.errors import EvaluationError
from asr.evaluation.split_decoding import decode_split
from asr.evaluation.evaluation_data import evaluation_data
from asr.evaluation.attention_choice import (check_shared_qk_keys, evaluation_attention, evaluation_key_form,
                                             set_evaluation_attention)
from asr.core.fault_injection import pause_point
from asr.text.metrics import paired_bootstrap_gap, percent, utterance_phone_errors
from asr.model.checkpoint import read_checkpoint
from asr.model.run_folder import run_folder_of
from attention_ext import AttentionConfigError, SharedQKRequiredError, parse_attention_spec


INVALID = "-"


@dataclass
class Column:
    label: str
    checkpoint: Path
    shared_qk: bool = False              # the model's, from its checkpoint: what decides a cell's key form
    trained_attention: str = "full"


def parse_columns(arguments: list[str]) -> list[Column]:
    """'LABEL=PATH' or 'PATH' (labelled by its run folder, or the file name) -> columns."""
    columns = []
    for argument in arguments:
        label, equals, path = argument.partition("=")
        if not equals:
            path = argument
            run = run_folder_of(path)
            label = run.name if run is not None else Path(path).stem
            # runs/<preset>/<timestamp>/: the preset names the column better than the time
            if run is not None and run.parent.name and any(ch.isdigit() for ch in run.name[:4]):
                label = run.parent.name
        # a column that cannot be evaluated stops the matrix before any cell runs
        hyper_parameters = read_checkpoint(path)["hyper_parameters"]
        columns.append(Column(label, Path(path), bool(hyper_parameters["model"].get("shared_qk", False)),
                              hyper_parameters["attention"]["name"]))
    labels = [column.label for column in columns]
    duplicated = sorted({label for label in labels if labels.count(label) > 1})
    if duplicated:
        raise EvaluationError(f"two checkpoints share the column name(s) {duplicated}; name them LABEL=PATH")
    return columns


def checkpoint_identity(path: Path) -> dict:
    stat = path.stat()
    return {"path": str(path.resolve()), "size": stat.st_size, "mtime_ns": stat.st_mtime_ns}


def _safe(text: str) -> str:
    return "".join(ch if ch.isalnum() or ch in "-_." else "_" for ch in text)


def cell_path(out: Path, column: str, spec: str) -> Path:
    return out / "cells" / f"{_safe(column)}__{_safe(spec)}.json"


def hypotheses_folder(out: Path, column: str, spec: str) -> Path:
    """Where a cell's hypotheses.jsonl (each utterance's reference and hypothesis) and results.json lie."""
    return out / "hypotheses" / _safe(column) / _safe(spec)


def phone_gap_interval(out: Path, column: str, spec: str, reference_spec: str = "full", samples: int = 1000,
                       confidence: float = 0.95) -> tuple[float, float, float]:
    """(gap, low, high): the PER of `column` evaluated with `spec` minus with `reference_spec`, from the
    two cells' hypotheses in the matrix folder `out`, and its paired-bootstrap interval over the
    utterances (asr.text.metrics.paired_bootstrap_gap, seed 0: the same numbers each time).

    FileNotFoundError naming the file when a cell has no hypotheses (a matrix from before they were
    written, or a cell not evaluated); ValueError when the hypotheses' PER is not the cell's (phones
    folded for scoring, as TIMIT's are, or a cell evaluated again since): the interval would be of
    another number than the one it is printed beside."""
    scorings = []
    for name in (reference_spec, spec):
        folder = hypotheses_folder(out, column, name)
        path = folder / "hypotheses.jsonl"
        if not path.is_file():
            raise FileNotFoundError(f"{path}: no hypotheses for column {column!r}, row {name!r}; evaluate "
                                    f"the cell (python -m asr.cross_matrix ... --out {out})")
        records = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
        if not records or any("phones" not in record for record in records):
            raise ValueError(f"{path}: no phone hypotheses (a model without a phone head has no PER)")
        counts = utterance_phone_errors([r["phones"]["reference"] for r in records],
                                        [r["phones"]["hypothesis"] for r in records])
        per = sum(e for e, _ in counts) / max(1, sum(t for _, t in counts))
        reported = json.loads((folder / "results.json").read_text()).get("error_rates", {}).get("per")
        if reported is None or abs(per - reported) > 1e-9:
            raise ValueError(f"{path}: the hypotheses score PER {per:.6f}, the cell reports {reported}: "
                             "their phones are not scored as listed (a folded phone set?), so no interval")
        scorings.append(counts)
    return paired_bootstrap_gap(scorings[0], scorings[1], samples, confidence)


def _write_json_atomic(path: Path, value: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    temporary = path.with_suffix(".json.tmp")
    temporary.write_text(json.dumps(value, indent=2) + "\n")
    os.replace(temporary, path)     # a cell file that exists is complete


def evaluation_settings(args: argparse.Namespace) -> dict:
    """What besides the checkpoint and attention decides a cell's numbers (cached cells must match)."""
    settings = {"split": args.split, "data_dir": args.data_dir, "data": dict(args.data), "decoder": args.decoder,
                "beam_size": args.beam_size, "seed": args.seed, "limit": args.limit}
    if args.decoder == "lexicon":
        settings.update(lexicon=args.lexicon, lm=args.lm, lm_weight=args.lm_weight, word_score=args.word_score)
        if args.extra_lexicon:     # only then: cells computed before the option existed stay valid
            settings["extra_lexicon"] = args.extra_lexicon
    return settings


def compute_column(column: Column, specs: list[str], args: argparse.Namespace, progress) -> None:
    """Evaluates the missing cells of one column (the model and its data are loaded once)."""
    settings = evaluation_settings(args)
    identity = checkpoint_identity(column.checkpoint)
    key_forms = {spec: evaluation_key_form(column.shared_qk, column.trained_attention, parse_attention_spec(spec),
                                           args.shared_qk_keys) for spec in specs}
    todo = _uncached_specs(column, specs, args.out, identity, settings, key_forms, progress)
    if not todo:
        return
    model = load_model(column.checkpoint, args.device)
    trained = dict(model.hparams.attention)
    data = None
    for spec in todo:
        # A separate-key attention in the Reformer form is computed densely: its time is no row's speed.
        converted = key_forms[spec] == "reformer" and not parse_attention_spec(spec).needs_shared_qk
        cell = {"column": column.label, "spec": spec, "checkpoint": identity, "settings": settings,
                "trained_with": trained, "key_form": key_forms[spec], "forward_time_comparable": not converted}
        try:
            # refuses lsh / shared_full without shared QK, and options above the head dim (the
            # attention's one check against the model, in evaluation_attention), changing nothing
            attention = evaluation_attention(model, spec)
            set_evaluation_attention(model, attention, args.shared_qk_keys)
        except AttentionConfigError as error:
            cell.update(valid=False, reason=str(error))
            _write_json_atomic(cell_path(args.out, column.label, spec), cell)
            why = ("needs shared query/key projections" if isinstance(error, SharedQKRequiredError)
                   else "does not fit the model's head dim")
            progress(f"{column.label} x {spec}: {INVALID} ({why})")
            continue
        if data is None:
            split = "eval" if args.data_dir else args.split
            data = evaluation_data(model, column.checkpoint, split, args.data_dir, dict(args.data),
                                   progress=False)
        pause_point("cross_matrix_cell")   # the fault suite kills here (asr.core.fault_injection)
        word_decoder = None
        if args.decoder == "lexicon":
            from asr.evaluation.decoding.evaluation import resolve_settings, start_word_decoder
            from asr.model.decoding_files import model_decoding_files
            word_decoder = start_word_decoder(model.tokenizers, resolve_settings(
                args.lexicon, args.lm, model_decoding_files(column.checkpoint), args.extra_lexicon, dashes=True,
                lm_weight=args.lm_weight, word_score=args.word_score))
        try:
            result = decode_split(model, data, args.decoder, args.beam_size, args.seed, args.limit,
                                  progress=sys.stderr.isatty(), word_decoder=word_decoder)
        finally:
            if word_decoder is not None:
                word_decoder[1].close()
        cell.update(valid=True, evaluated_with=attention.as_config(),
                    same_as_training=attention.as_config() == trained, split=data.split,
                    utterances=len(result.utterances), error_rates=result.rates, **result.timing())
        write_outputs(hypotheses_folder(args.out, column.label, spec), result, cell)
        _write_json_atomic(cell_path(args.out, column.label, spec), cell)
        rates = result.rates
        progress(f"{column.label} x {spec}: PER {percent(rates.get('per'))} WER {percent(rates.get('wer'))}, "
                 f"{cell['forward_ms_per_utterance']:.1f} ms/utt")


def _uncached_specs(column: Column, specs: list[str], out: Path, identity: dict, settings: dict,
                    key_forms: dict[str, str], progress) -> list[str]:
    """The specs of `column` whose cell is missing, or was computed from another checkpoint, other
    settings or another key form."""
    todo = []
    for spec in specs:
        path = cell_path(out, column.label, spec)
        if path.is_file():
            cached = json.loads(path.read_text())
            # a cell from before key forms were recorded had the raw form
            cached_form = cached.get("key_form") or evaluation_key_form(
                column.shared_qk, column.trained_attention, parse_attention_spec(spec), "raw")
            if (cached.get("checkpoint") == identity and cached.get("settings") == settings
                    and cached_form == key_forms[spec]):
                progress(f"{column.label} x {spec}: cached")
                continue
        todo.append(spec)
    return todo


def load_cells(out: Path, columns: list[Column], specs: list[str]) -> dict[tuple[str, str], dict]:
    return {(column.label, spec): json.loads(cell_path(out, column.label, spec).read_text())
            for column in columns for spec in specs}


def metric_of(cell: dict, metric: str) -> float | None:
    return cell.get("error_rates", {}).get(metric) if cell.get("valid") else None


def row_forward_ms(cells: dict, columns: list[Column], spec: str) -> float | None:
    """Mean forward time per utterance of a row over its valid cells computed by the attention's own
    code (not those of a separate-key attention in the Reformer form, computed densely)."""
    times = [cells[column.label, spec]["forward_ms_per_utterance"] for column in columns
             if cells[column.label, spec].get("valid")
             and cells[column.label, spec].get("forward_time_comparable", True)]
    return sum(times) / len(times) if times else None


def matrix_rows(cells: dict, columns: list[Column], specs: list[str]) -> list[dict]:
    """One dict per evaluate-with row: per column PER, WER, validity and the training mark."""
    rows = []
    for spec in specs:
        row = {"evaluate_with": spec, "forward_ms_per_utterance": row_forward_ms(cells, columns, spec),
               "cells": {}}
        for column in columns:
            cell = cells[column.label, spec]
            row["cells"][column.label] = {
                "valid": bool(cell.get("valid")), "same_as_training": bool(cell.get("same_as_training")),
                "per": metric_of(cell, "per"), "wer": metric_of(cell, "wer"), "cer": metric_of(cell, "cer"),
                "wer_lexicon": metric_of(cell, "wer_lexicon"),
                "forward_ms_per_utterance": cell.get("forward_ms_per_utterance"),
                "key_form": cell.get("key_form"), "reason": cell.get("reason")}
        rows.append(row)
    return rows


def _cell_text(cell: dict, metric: str) -> str:
    if not cell["valid"]:
        return INVALID
    value = cell[metric]
    text = "n/a" if value is None else f"{100 * value:.2f}"
    return f"**{text}***" if cell["same_as_training"] else text


def format_markdown(rows: list[dict], columns: list[Column], metrics: list[str], split: str) -> str:
    lines = []
    for metric in metrics:
        lines.append(f"{metric.upper().replace('_LEXICON', ' (lexicon + LM)')} (%) on {split}; columns: trained with, rows: evaluated with; "
                     f"**x*** = evaluated with the training attention; {INVALID} = not a valid pair")
        lines.append("")
        header = ["evaluate with \\ train with"] + [c.label for c in columns] + ["forward ms/utt"]
        lines.append("| " + " | ".join(header) + " |")
        lines.append("|" + "|".join(["---"] + ["---:"] * (len(header) - 1)) + "|")
        for row in rows:
            forward = row["forward_ms_per_utterance"]
            cells = [_cell_text(row["cells"][c.label], metric) for c in columns]
            lines.append("| " + " | ".join([row["evaluate_with"], *cells,
                                             "-" if forward is None else f"{forward:.1f}"]) + " |")
        lines.append("")
    return "\n".join(lines)


def key_form_note(shared_qk_keys: str) -> str:
    """The line under the tables that says which keys the shared-QK columns ran with."""
    if shared_qk_keys == "trained":
        return ("Shared-QK columns: full, clustered, i-clustered and oracle-top ran in the key form each model was "
                "trained with (after shared_full or lsh: unit-normalised keys, no attention to self; "
                "--shared-qk-keys raw for keys equal to the raw queries); their forward times are left out of "
                "the row means (computed densely).\n")
    return ("Shared-QK columns: full, clustered, i-clustered and oracle-top ran with keys equal to the raw queries, "
            "attention to self allowed (--shared-qk-keys raw).\n")


def write_csv(rows: list[dict], columns: list[Column], path: Path) -> None:
    with open(path, "w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(["evaluate_with", "train_with", "valid", "same_as_training", "per", "wer", "cer",
                         "forward_ms_per_utterance"])
        for row in rows:
            for column in columns:
                cell = row["cells"][column.label]
                writer.writerow([row["evaluate_with"], column.label, cell["valid"], cell["same_as_training"],
                                 *("" if cell[m] is None else f"{cell[m]:.6f}" for m in ("per", "wer", "cer")),
                                 "" if cell["forward_ms_per_utterance"] is None
                                 else f"{cell['forward_ms_per_utterance']:.3f}"])


def plot(rows: list[dict], columns: list[Column], metric: str, out: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    values = [[row["cells"][c.label][metric] if row["cells"][c.label]["valid"] else math.nan for c in columns]
              for row in rows]
    figure, axis = plt.subplots(figsize=(1.6 * len(columns) + 3, 0.5 * len(rows) + 2))
    data = [[math.nan if v is None else 100 * v for v in line] for line in values]
    image = axis.imshow(data, cmap="viridis_r", aspect="auto")
    axis.set_xticks(range(len(columns)), [c.label for c in columns], rotation=30, ha="right")
    axis.set_yticks(range(len(rows)), [row["evaluate_with"] for row in rows])
    for i, row in enumerate(rows):
        for j, column in enumerate(columns):
            cell = row["cells"][column.label]
            axis.text(j, i, _cell_text(cell, metric).replace("*", ""), ha="center", va="center",
                      fontsize=8, color="black" if cell["valid"] else "gray",
                      fontweight="bold" if cell["same_as_training"] else "normal")
    axis.set_xlabel("trained with")
    axis.set_ylabel("evaluated with")
    figure.colorbar(image, label=f"{metric.upper()} (%)")
    figure.tight_layout()
    figure.savefig(out / "matrix_heatmap.png", dpi=120)
    plt.close(figure)

    plot_speed_accuracy(rows, columns, metric, out / "speed_accuracy.png")


def plot_speed_accuracy(rows: list[dict], columns: list[Column], metric: str, path: Path) -> None:
    """Error against forward time: one panel per training attention (a shared time axis, each panel's
    error axis its own, so close rows stay apart; the heatmap compares across columns), each
    evaluate-with row one colour and marker in every panel, named once in a shared legend; the
    training attention's own point is ringed. Text labels beside the points ran into one unreadable
    band where many rows score alike, so the legend names them instead."""
    import matplotlib.pyplot as plt
    markers = "osD^v<>phX*P"
    colours = plt.get_cmap("tab20").colors
    style = {row["evaluate_with"]: (colours[i % len(colours)], markers[i % len(markers)])
             for i, row in enumerate(rows)}
    panels = max(1, len(columns))
    width = min(3, panels)
    height = math.ceil(panels / width)
    figure, axes = plt.subplots(height, width, figsize=(3.6 * width + 2.2, 3.0 * height + 0.6),
                                sharex=True, squeeze=False)
    for index, axis in enumerate(axes.flat):
        if index >= len(columns):
            axis.set_visible(False)
            continue
        column = columns[index]
        for row in rows:
            cell = row["cells"][column.label]
            if not cell["valid"] or cell[metric] is None or cell["forward_ms_per_utterance"] is None:
                continue
            colour, marker = style[row["evaluate_with"]]
            axis.scatter(cell["forward_ms_per_utterance"], 100 * cell[metric], color=colour, marker=marker, s=36,
                         edgecolors="black" if cell["same_as_training"] else "none", linewidths=1.2)
        axis.set_title(f"trained with {column.label}", fontsize=9)
        axis.grid(alpha=0.3)
        axis.set_ylabel(f"{metric.upper()} (%)")
        if index // width == height - 1 or index + width >= len(columns):
            axis.set_xlabel("forward ms per utterance")
    handles = [plt.Line2D([], [], linestyle="", marker=marker, color=colour, label=spec)
               for spec, (colour, marker) in style.items()]
    handles.append(plt.Line2D([], [], linestyle="", marker="o", markerfacecolor="white", markeredgecolor="black",
                              label="(ringed: the training attention)"))
    figure.legend(handles=handles, title="evaluated with", loc="center right", fontsize=8, title_fontsize=8)
    figure.tight_layout(rect=(0, 0, 1 - 2.3 / (3.6 * width + 2.2), 1))
    figure.savefig(path, dpi=120)
    plt.close(figure)


def run(args: argparse.Namespace, progress=print) -> dict:
    """Computes the missing cells and writes the tables; returns the matrix as JSON-ready dict."""
    check_device(args.device)
    from asr.evaluation.decoding.evaluation import check_lexicon_options
    check_lexicon_options(args.decoder, args.lexicon, args.lm, args.extra_lexicon, dashes=True)
    check_shared_qk_keys(args.shared_qk_keys, "--shared-qk-keys")
    columns = parse_columns(args.checkpoints)
    specs = list(dict.fromkeys(args.specs))
    for spec in specs:
        parse_attention_spec(spec)              # a bad row fails before any evaluation
    if args.threads:
        torch.set_num_threads(args.threads)
    args.out.mkdir(parents=True, exist_ok=True)
    from tqdm.auto import tqdm
    total = len(columns) * len(specs)
    done = 0   # our own count: a bar disabled (stderr not a terminal) counts nothing
    with tqdm(total=total, desc="cells", unit="cell", disable=not sys.stderr.isatty(), leave=False) as bar:
        def report(line: str) -> None:
            nonlocal done
            done += 1
            bar.update(1)
            bar.write(f"[cross_matrix {done}/{total}] {line}", file=sys.stdout)
        for column in columns:
            compute_column(column, specs, args, report)
    cells = load_cells(args.out, columns, specs)
    rows = matrix_rows(cells, columns, specs)
    split = next((cell["split"] for cell in cells.values() if cell.get("valid")), args.split or "test")
    metrics = [m for m in ("per", "wer_lexicon" if args.decoder == "lexicon" else "wer") if any(row["cells"][c.label][m] is not None
                                                  for row in rows for c in columns)]
    table = format_markdown(rows, columns, metrics, split)
    if any(column.shared_qk for column in columns):
        table += key_form_note(args.shared_qk_keys)
    (args.out / "matrix.md").write_text(table)
    write_csv(rows, columns, args.out / "matrix.csv")
    matrix = {"split": split, "columns": [{"label": c.label, "checkpoint": str(c.checkpoint)} for c in columns],
              "rows": rows, "settings": evaluation_settings(args), "shared_qk_keys": args.shared_qk_keys,
              "threads": torch.get_num_threads(),
              "device": args.device}
    (args.out / "matrix.json").write_text(json.dumps(matrix, indent=2) + "\n")
    if metrics:
        plot(rows, columns, metrics[0], args.out)
    return matrix

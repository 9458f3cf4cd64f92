"""recipes.synth.experiment: the check of the paper's findings on a hand-made matrix with a known verdict,
the step budget, the paper-length setting's config, and what the experiment keeps (results.json, curves)."""
import json
import math

import pytest

from recipes.synth.experiment import main, training_budget
from recipes.synth.experiment_results import (PUBLISHED, experiment_results, plot_training_curves, publish,
                                              validation_curve, with_columns_from)
from recipes.synth.experiment_settings import PRESETS, SETTINGS, SPECS, training_spec
from recipes.synth.paper_findings import format_findings, format_magnitudes, paper_findings, table1_magnitudes
from test_presets_on_fixtures import compose_config   # composes conf/ as asr.train does

COLUMNS = ["full", "shared_full", "lsh1", "lsh4", "clustered", "iclustered"]
NEEDS_SHARED_QK = {"shared-full", "lsh-1", "lsh-4"}
SHARED_QK_MODELS = {"shared_full", "lsh1", "lsh4"}
DIAGONAL = {("full", "full"), ("shared-full", "shared_full"), ("lsh-1", "lsh1"), ("lsh-4", "lsh4"),
            ("clustered-64", "clustered"), ("i-clustered-64", "iclustered")}


def matrix(per):
    """matrix.json rows from per(row, column) -> PER; pairs that need shared QK on other models are invalid."""
    rows = []
    for spec in SPECS:
        cells = {}
        for column in COLUMNS:
            valid = spec not in NEEDS_SHARED_QK or column in SHARED_QK_MODELS
            cells[column] = {"valid": valid, "per": per(spec, column) if valid else None}
            cells[column]["same_as_training"] = (spec, column) in DIAGONAL
        rows.append({"evaluate_with": spec, "cells": cells})
    return {"columns": [{"label": column} for column in COLUMNS], "rows": rows}


def paper_like(spec, column):
    """Table 1's pattern: i-clustered < clustered, 64 < 32, lsh bad on shared_full, oracle-top worse,
    and the clustered / i-clustered models about as good under full as under their own attention."""
    base = {"full": 0.10, "shared-full": 0.10, "lsh-1": 0.70, "lsh-4": 0.60, "clustered-32": 0.45,
            "clustered-64": 0.25, "i-clustered-32": 0.15, "i-clustered-64": 0.12, "oracle-top": 0.30,
            "linear": 0.80, "agglomerative-8": 0.90}   # the further rows: no finding rests on them
    own = {"clustered": "clustered-64", "iclustered": "i-clustered-64"}
    if spec == "full" and column in own:
        return base[own[column]] + 0.004
    return base.get(spec, 0.95)   # an attention compared since (attention_ext.comparisons): no finding either


def test_every_finding_holds_on_a_matrix_shaped_like_table_1():
    findings = paper_findings(matrix(paper_like))
    assert [item["holds"] for item in findings] == [True, True, True, True, True]
    assert [item["compared"] for item in findings] == [4, 12, 4, 6, 2]
    text = format_findings(findings)
    assert "full model: i-clustered-32 15.00 < clustered-32 45.00: yes" in text


def test_a_broken_comparison_is_reported_with_its_numbers():
    def oracle_beats_iclustered_on_full(spec, column):
        if (spec, column) == ("oracle-top", "full"):
            return 0.05
        return paper_like(spec, column)

    findings = paper_findings(matrix(oracle_beats_iclustered_on_full))
    oracle = findings[3]
    assert not oracle["holds"] and (oracle["held"], oracle["compared"]) == (5, 6)
    assert "full model: i-clustered-64 12.00 < oracle-top 5.00: NO" in oracle["evidence"]
    assert all(item["holds"] for item in findings[:3])


def test_a_model_far_from_its_own_attention_under_full_breaks_the_closeness_finding():
    def iclustered_falls_apart_under_full(spec, column):
        if (spec, column) == ("full", "iclustered"):
            return 0.30
        return paper_like(spec, column)

    closeness = paper_findings(matrix(iclustered_falls_apart_under_full))[4]
    assert not closeness["holds"] and (closeness["held"], closeness["compared"]) == (1, 2)
    assert "iclustered model: full 30.00 within 1 of i-clustered-64 12.00: NO" in closeness["evidence"]


def test_magnitudes_give_each_gap_in_points_beside_the_papers():
    """paper_like's full column: full 10, clustered-32 45, i-clustered-32 15 (%): a 35-point clustered gap
    (the first aim holds) but i-clustered 5 points off full (the second does not)."""
    magnitudes = table1_magnitudes(matrix(paper_like), "full", 32, 64)
    rows = {row["paper_row"]: row for row in magnitudes["rows"]}
    assert [row["row"] for row in magnitudes["rows"]] == ["full", "clustered-32", "clustered-64", "i-clustered-32",
                                                          "i-clustered-64", "oracle-top"]
    assert rows["clustered-100"]["paper_gap"] == pytest.approx(44.88 - 5.14)
    assert rows["i-clustered-100"]["paper_gap"] == pytest.approx(9.29 - 5.14)
    assert rows["oracle-top"]["paper_per"] == 17.16
    assert rows["clustered-100"]["per"] == pytest.approx(45.0) and rows["clustered-100"]["gap"] == pytest.approx(35.0)
    assert rows["i-clustered-100"]["gap"] == pytest.approx(5.0) and rows["full"]["gap"] == pytest.approx(0.0)
    assert [aim["holds"] for aim in magnitudes["aims"]] == [True, False] and not magnitudes["reproduced"]
    text = format_magnitudes(magnitudes)
    assert "| clustered-100 | 44.88 | +39.74 | clustered-32 | 45.00 | +35.00 |" in text
    assert "i-clustered-32 within 3 points of full: +5.00 points: NO" in text
    assert "the paper's gap (both aims)**: not reproduced here" in text


def test_the_gap_is_reproduced_when_clustered_breaks_and_i_clustered_holds():
    def reproduced(spec, column):
        return {"full": 0.0514, "clustered-32": 0.4488, "i-clustered-32": 0.0800}.get(spec, paper_like(spec, column))

    magnitudes = table1_magnitudes(matrix(reproduced), "full", 32, 64)
    assert [aim["holds"] for aim in magnitudes["aims"]] == [True, True] and magnitudes["reproduced"]
    assert [row["gap"] for row in magnitudes["rows"][:2]] == pytest.approx([0.0, 44.88 - 5.14])
    # the paper's own numbers: its i-clustered-100 is 4.15 points off full, outside the 3 the aim allows
    def table_1(spec, column):
        return {"full": 0.0514, "clustered-32": 0.4488, "i-clustered-32": 0.0929}.get(spec, paper_like(spec, column))

    paper = table1_magnitudes(matrix(table_1), "full", 32, 64)
    assert all(row["gap"] == pytest.approx(row["paper_gap"]) for row in paper["rows"]
               if row["paper_row"] in ("full", "clustered-100", "i-clustered-100"))
    assert [aim["holds"] for aim in paper["aims"]] == [True, False]
    # a column without the cells: the aims are missing, not held
    missing = table1_magnitudes(matrix(table_1), "no_such_column", 32, 64)
    assert [aim["holds"] for aim in missing["aims"]] == [None, None] and not missing["reproduced"]
    assert "clustered-32 at least 10 points worse than full: - points: missing" in format_magnitudes(missing)



def write_cell(out, column, spec, pairs, per=None):
    """A matrix folder's hypotheses for one cell: (reference, hypothesis) phone strings per utterance,
    and results.json with the PER they score (or `per`, a cell that says another)."""
    from asr.evaluation.attention_matrix import hypotheses_folder
    from asr.text.metrics import phone_error_rate
    folder = hypotheses_folder(out, column, spec)
    folder.mkdir(parents=True)
    (folder / "hypotheses.jsonl").write_text("".join(
        json.dumps({"id": f"u{i}", "phones": {"reference": r, "hypothesis": h}}) + "\n" for i, (r, h) in enumerate(pairs)))
    scored = phone_error_rate([r for r, _ in pairs], [h for _, h in pairs])
    (folder / "results.json").write_text(json.dumps({"error_rates": {"per": scored if per is None else per}}))
    return scored


def test_magnitudes_give_each_gap_its_interval_over_the_utterances(tmp_path):
    """Full is right on 10 utterances of 4 phones; clustered-32 misses one phone in every one (a 25-point
    gap that no resampling changes), i-clustered-32 in the first only (2.5 points, whose interval
    reaches 0: the resamplings without that utterance); the other rows have no cells."""
    references = ["AA B K S"] * 10
    pers = {"full": write_cell(tmp_path, "full", "full", [(r, r) for r in references]),
            "clustered-32": write_cell(tmp_path, "full", "clustered-32", [(r, "AA B K") for r in references]),
            "i-clustered-32": write_cell(tmp_path, "full", "i-clustered-32",
                                         [(r, "AA B K" if i == 0 else r) for i, r in enumerate(references)])}
    matrix = {"columns": [{"label": "full"}],
              "rows": [{"evaluate_with": spec, "cells": {"full": {"valid": True, "per": per}}}
                       for spec, per in pers.items()]}
    magnitudes = table1_magnitudes(matrix, "full", 32, 64, matrix_folder=tmp_path)
    rows = {row["row"]: row for row in magnitudes["rows"]}
    assert rows["clustered-32"]["gap"] == pytest.approx(25.0)
    assert rows["clustered-32"]["interval"] == pytest.approx([25.0, 25.0])
    low, high = rows["i-clustered-32"]["interval"]
    assert low == pytest.approx(0.0) and 2.5 < high <= 25.0
    assert rows["full"]["interval"] is None and rows["oracle-top"]["interval"] is None
    text = format_magnitudes(magnitudes)
    assert "| clustered-100 | 44.88 | +39.74 | clustered-32 | 25.00 | +25.00 | +25.00 to +25.00 |" in text
    assert "clustered-32 at least 10 points worse than full: +25.00 (95 % interval +25.00 to +25.00) points: yes" in text
    # without the folder, the table is as it was
    assert "interval" not in format_magnitudes(table1_magnitudes(matrix, "full", 32, 64))


def test_a_gap_without_trustworthy_hypotheses_has_no_interval_and_says_why(tmp_path):
    from asr.evaluation.attention_matrix import phone_gap_interval
    references = ["AA B K S"] * 4
    write_cell(tmp_path, "full", "full", [(r, r) for r in references])
    write_cell(tmp_path, "full", "clustered-32", [(r, "AA B") for r in references], per=0.10)   # says another PER
    with pytest.raises(ValueError, match="the cell reports 0.1"):
        phone_gap_interval(tmp_path, "full", "clustered-32")
    with pytest.raises(FileNotFoundError, match="no hypotheses for column 'full', row 'i-clustered-32'"):
        phone_gap_interval(tmp_path, "full", "i-clustered-32")
    matrix = {"columns": [{"label": "full"}],
              "rows": [{"evaluate_with": spec, "cells": {"full": {"valid": True, "per": per}}}
                       for spec, per in (("full", 0.0), ("clustered-32", 0.10), ("i-clustered-32", 0.0))]}
    magnitudes = table1_magnitudes(matrix, "full", 32, 64, matrix_folder=tmp_path)
    assert [row["interval"] for row in magnitudes["rows"]] == [None] * 6
    text = format_magnitudes(magnitudes)
    assert text.count("- no interval: ") == 2 and "a folded phone set?" in text


# ---- budgets and settings ------------------------------------------------------------------------
def test_the_budget_is_steps_unless_minutes_are_asked_for():
    assert training_budget(800, None) == ["trainer.max_minutes=null", "trainer.max_steps=800",
                                          "trainer.max_epochs=-1"]
    assert training_budget(800, 5.0) == ["trainer.max_minutes=5.0", "trainer.max_steps=-1"]


@pytest.mark.parametrize("preset", PRESETS)
def test_the_paper_setting_gives_about_780_positions_and_100_clusters(preset):
    """recipes/synth utterances last ~7.8 s (780 frames of 10 ms) at scale 1: twice as long through the
    stride-2 front end gives ~780 positions, from a corpus folder of its own with the same hours."""
    setting = SETTINGS["paper"]
    cfg = compose_config(f"conf={preset}", *setting.preset_overrides(preset),
                         *training_budget(setting.steps, None))
    assert 780 * cfg.synth_corpus.utterance_scale / cfg.model.subsampling == 780
    assert cfg.data.root != compose_config(f"conf={preset}").data.root
    assert cfg.synth_corpus.utterance_scale * cfg.synth_corpus.train_utterances == 3000
    assert cfg.trainer.max_minutes is None and cfg.trainer.max_steps == setting.steps
    if cfg.attention.name in ("clustered", "iclustered"):
        assert cfg.attention.clusters == 100
    # Table 1's rows and today's further ones; an attention compared since appends (test_comparisons.py)
    assert setting.specs[:11] == ("full", "shared-full", "lsh-1", "lsh-4", "clustered-100", "clustered-200",
                                  "i-clustered-100", "i-clustered-200", "oracle-top", "linear", "agglomerative-8")


# ---- what the experiment keeps -------------------------------------------------------------------
def fake_run(folder, steps, per, curve):
    """A finished asr.train run folder: results.json and two starts' metrics.csv (a resumed run)."""
    (folder / "logs" / "version_0").mkdir(parents=True)
    (folder / "logs" / "version_1").mkdir(parents=True)
    (folder / "results.json").write_text(json.dumps({
        "steps": steps, "epochs": 2, "test": {"per": per, "wer": 2 * per, "encoder_length": 780},
        "epoch_times": [{"train_seconds": 10.0}, {"train_seconds": 12.5}]}))
    header = "epoch,step,train/loss,val/per\n"
    half = len(curve) // 2
    for version, points in (("version_0", curve[:half]), ("version_1", curve[half:])):
        lines = [f"0,{step - 1},,{value}" for step, value in points] + ["0,5,3.0,"]
        (folder / "logs" / version / "metrics.csv").write_text(header + "\n".join(lines) + "\n")


def test_results_json_holds_steps_rates_and_every_valid_cell(tmp_path):
    fake_run(tmp_path / "synth_full", 1600, 0.05, [(200, 0.9), (400, 0.3), (600, 0.1), (800, 0.05)])
    fake_run(tmp_path / "synth_lsh1", 1600, 0.12, [(200, 1.0), (400, 0.8)])
    columns = ["full", "lsh1"]
    table = {"columns": [{"label": c} for c in columns], "rows": [
        {"evaluate_with": "full", "cells": {
            "full": {"valid": True, "per": 0.05, "wer": 0.2, "forward_ms_per_utterance": 20.0},
            "lsh1": {"valid": True, "per": 0.5, "wer": 0.9, "forward_ms_per_utterance": 21.0}}},
        {"evaluate_with": "lsh-1", "cells": {
            "full": {"valid": False, "per": None, "wer": None, "forward_ms_per_utterance": None},
            "lsh1": {"valid": True, "per": 0.12, "wer": 0.4, "forward_ms_per_utterance": 9.0}}}]}
    results = experiment_results(tmp_path, ["synth_full", "synth_lsh1"], table, "paper")
    assert results["presets"]["full"] == {"steps": 1600, "epochs": 2, "test_per": 0.05, "test_wer": 0.1,
                                          "encoder_length": 780, "train_seconds": 22.5}
    assert results["matrix"] == [
        {"train": "full", "evaluate": "full", "per": 0.05, "wer": 0.2, "forward_ms_per_utterance": 20.0},
        {"train": "lsh1", "evaluate": "full", "per": 0.5, "wer": 0.9, "forward_ms_per_utterance": 21.0},
        {"train": "lsh1", "evaluate": "lsh-1", "per": 0.12, "wer": 0.4, "forward_ms_per_utterance": 9.0}]
    # the curve joins both starts of a resumed run, at the step the validation ran after
    assert validation_curve(tmp_path / "synth_full") == [(200, 0.9), (400, 0.3), (600, 0.1), (800, 0.05)]
    plot_training_curves(tmp_path, ["synth_full", "synth_lsh1"], tmp_path / "curves.png")
    assert (tmp_path / "curves.png").stat().st_size > 1000
    assert all(math.isfinite(value) for _, value in validation_curve(tmp_path / "synth_lsh1"))


def test_a_usage_error_stops_the_experiment_with_status_2(tmp_path, capsys):
    """A bad row before any training; a bad asr.train override as asr.train reports it (status 2)."""
    assert main(["--out", str(tmp_path), "--specs", "full", "clustered-x"]) == 2
    assert "recipes.synth.experiment: error: unknown attention spec 'clustered-x'" in capsys.readouterr().err
    assert not any(tmp_path.iterdir())
    assert main(["--out", str(tmp_path), "--presets", "synth_full", "--train-override", "model.nonsense=1"]) == 2
    assert "asr.train stopped on synth_full with exit status 2" in capsys.readouterr().err


def test_publish_copies_what_results_md_shows(tmp_path):
    out, folder = tmp_path / "out", tmp_path / "recipes" / "synth"
    for source in PUBLISHED:
        (out / source).parent.mkdir(parents=True, exist_ok=True)
        (out / source).write_text(f"content of {source}")
    publish(out, folder)
    assert {path.name: path.read_text() for path in folder.iterdir()} == {
        name: f"content of {source}" for source, name in PUBLISHED.items()}


def test_the_training_spec_of_each_column_is_its_diagonal_row():
    short, paper = SETTINGS["short"], SETTINGS["paper"]
    assert {(row, column) for row in SPECS for column in COLUMNS
            if training_spec(column, short) == row} == DIAGONAL
    assert (training_spec("iclustered", paper), training_spec("lsh4", paper)) == ("i-clustered-100", "lsh-4")


def test_columns_from_an_earlier_run_complete_the_matrix_and_its_findings(tmp_path, capsys):
    """Three shared-QK columns re-run: the other three come from the earlier results.json, cell for cell,
    and the findings over the whole matrix are those of the same matrix built at once."""
    whole = matrix(paper_like)
    for row in whole["rows"]:
        for column, cell in row["cells"].items():
            cell.update(wer=0.9, forward_ms_per_utterance=30.0)
    earlier = experiment_results(tmp_path, [], whole, "short")     # every valid cell, as results.json keeps them
    rerun = [column for column in COLUMNS if column in SHARED_QK_MODELS]
    part = {"columns": [{"label": column} for column in rerun],
            "rows": [{"evaluate_with": row["evaluate_with"],
                      "cells": {column: dict(row["cells"][column]) for column in rerun}} for row in whole["rows"]]}
    merged = with_columns_from(part, earlier, "earlier/results.json")
    assert [column["label"] for column in merged["columns"]] == COLUMNS
    assert [column.get("from") for column in merged["columns"]] == [
        None if column in SHARED_QK_MODELS else "earlier/results.json" for column in COLUMNS]
    cell = next(row for row in merged["rows"] if row["evaluate_with"] == "clustered-32")["cells"]["full"]
    assert cell == {"valid": True, "per": 0.45, "wer": 0.9, "forward_ms_per_utterance": 30.0,
                    "from": "earlier/results.json", "same_as_training": False}
    assert format_findings(paper_findings(merged)) == format_findings(paper_findings(whole))
    assert {entry.get("from") for entry in experiment_results(tmp_path, [], merged, "short")["matrix"]} == {
        None, "earlier/results.json"}
    # a file that is not a results.json stops the experiment before any training
    (tmp_path / "bad.json").write_text('{"matrix": [{"train": "full"}]}')
    assert main(["--out", str(tmp_path / "out"), "--columns-from", str(tmp_path / "bad.json")]) == 2
    error = capsys.readouterr().err
    assert f"--columns-from {tmp_path / 'bad.json'}: not a readable results.json" in error
    assert not (tmp_path / "out").exists()
    # nor does a results.json of the other setting (its cluster counts and length are another matrix)
    (tmp_path / "short.json").write_text(json.dumps(earlier))
    assert main(["--out", str(tmp_path / "out"), "--columns-from", str(tmp_path / "short.json")]) == 2
    assert "holds the 'short' setting's matrix; run with --setting short" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()

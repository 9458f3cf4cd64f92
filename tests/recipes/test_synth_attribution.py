"""recipes.synth.attribution on sharpening.json files written here, whose attribution is known: the
per-run summaries, the differences (training length, each control, at the last common step), the
files, a control measured with its own probe, the Table 1 magnitudes from the main run's matrix, and
the errors."""
import json
from pathlib import Path

import pytest

from recipes.synth import attribution

ROWS = ["full", "clustered-100", "i-clustered-100"]


def layer(entropy: float, local5: float, local20: float, spread: float) -> dict:
    return {"layer": 0, "entropy": entropy, "locality5": local5, "locality20": local20, "query_similarity": 0.5,
            "cluster_spread": 100 * spread, "cluster_spread_fraction": spread, "clustering_error": spread / 2,
            "clustering_output_error": spread / 5, "clustering_layer_error": spread / 10, "attention_share": 2 * local5}


def point(step: int, full: float, clustered: float, iclustered: float, by_layer=None) -> dict:
    per = {"full": full, "clustered-100": clustered, "i-clustered-100": iclustered}
    return {"step": step, "per": per, "mean_entropy": 0.6,
            "gap_to_full": {row: value - full for row, value in per.items() if row != "full"},
            "layers": [layer(0.5, 0.2, 0.4, 0.10), layer(0.7, 0.4, 0.6, 0.20)],
            "per_by_layer": None if by_layer is None else [full + gap for gap in by_layer],
            "gap_by_layer": by_layer}


def write_run(folder: Path, points: list[dict], **settings) -> Path:
    folder.mkdir(parents=True)
    measured = {"run": str(folder.parent), "split": "dev", "rows": ROWS, "limit": None, "probe": "clustered-100",
                "points": points, **settings}
    (folder / "sharpening.json").write_text(json.dumps(measured))
    return folder


@pytest.fixture
def three_runs(tmp_path):
    # main: the gap grows from 1 to 12 points; the front-end control keeps it at 2, the layer-form one at 9.
    main = write_run(tmp_path / "main", [point(1000, 0.30, 0.31, 0.30, by_layer=[0.0, 0.01]),
                                         point(2000, 0.10, 0.22, 0.11, by_layer=[0.05, 0.02])])
    front = write_run(tmp_path / "stride2", [point(1000, 0.20, 0.22, 0.20), point(2000, 0.08, 0.10, 0.08),
                                             point(3000, 0.06, 0.08, 0.06)])
    form = write_run(tmp_path / "prenorm", [point(1000, 0.40, 0.40, 0.40), point(2000, 0.12, 0.21, 0.12)])
    return tmp_path, main, front, form


def test_the_attribution_of_a_known_gap(three_runs, capsys):
    root, main, front, form = three_runs
    out = root / "out"
    assert attribution.main(["--main", str(main), "--control", f"front end={front}",
                             "--control", f"layer form={form}", "--out", str(out)]) == 0
    result = json.loads((out / "attribution.json").read_text())
    items = {item["factor"]: item for item in result["attribution"]}
    assert items["training length"]["gap_difference"] == pytest.approx(0.12 - 0.01)
    # the front-end control's last step is 3000, where its gap is 2 points; at the common step 2000 also 2
    assert items["front end"]["gap_difference"] == pytest.approx(0.12 - 0.02)
    assert items["front end"]["compares"] == "main (clustered-100) at step 2000 - front end (clustered-100) at step 3000"
    assert items["front end"]["at_common_step"] == {"step": 2000, "gap_difference": pytest.approx(0.10)}
    assert items["layer form"]["gap_difference"] == pytest.approx(0.12 - 0.09)
    main_steps = result["runs"][0]["steps"]
    assert [step["step"] for step in main_steps] == [1000, 2000]
    last = main_steps[-1]
    assert last["mean_locality5"] == pytest.approx(0.3) and last["mean_locality20"] == pytest.approx(0.5)
    assert last["mean_cluster_spread_fraction"] == pytest.approx(0.15)
    assert last["mean_clustering_error"] == pytest.approx(0.075)
    assert last["mean_clustering_output_error"] == pytest.approx(0.03)
    assert last["mean_clustering_layer_error"] == pytest.approx(0.015) and last["mean_attention_share"] == pytest.approx(0.6)
    assert last["largest_gap_in_one_layer"] == {"layer": 0, "gap": pytest.approx(0.05)}
    assert result["runs"][1]["steps"][0]["largest_gap_in_one_layer"] is None      # not measured by layer
    printed = capsys.readouterr().out
    assert ("| front end | main (clustered-100) at step 2000 - front end (clustered-100) at step 3000 | +10.00 | "
            "+10.00 (step 2000) |") in printed
    assert "| training length | main (clustered-100) at step 2000 - at step 1000 | +11.00 | - |" in printed
    assert ("| main | clustered-100 | 2000 | 10.00 | +12.00 | +1.00 | 0.600 | 0.300 | 0.500 | 0.150 | 0.075 | "
            "0.030 | 0.015 | 0.600 | +5.00 (layer 0) |") in printed
    assert (out / "attribution.md").read_text() in printed
    assert (out / "attribution.png").stat().st_size > 10_000


def test_a_control_measured_with_its_own_probe_is_compared_by_that_probes_gap(three_runs, capsys):
    root, main, _, _ = three_runs
    # the stride-2 control at half the positions, measured at the main run's queries per cluster
    half = [{**point(2000, 0.08, 0.0, 0.0), "per": {"full": 0.08, "clustered-50": 0.11, "i-clustered-50": 0.085},
             "gap_to_full": {"clustered-50": 0.03, "i-clustered-50": 0.005}}]
    front = write_run(root / "stride2_50", half, probe="clustered-50", rows=["full", "clustered-50", "i-clustered-50"])
    out = root / "out"
    assert attribution.main(["--main", str(main), "--control", f"front end={front}", "--out", str(out)]) == 0
    result = json.loads((out / "attribution.json").read_text())
    front_end = result["attribution"][1]
    assert front_end["gap_difference"] == pytest.approx(0.12 - 0.03)
    assert front_end["compares"] == "main (clustered-100) at step 2000 - front end (clustered-50) at step 2000"
    printed = capsys.readouterr().out
    header = next(line for line in printed.splitlines() if line.startswith("| run |"))
    assert "| clustered-100 gap | i-clustered-100 gap | clustered-50 gap | i-clustered-50 gap |" in header
    assert "| front end | clustered-50 | 2000 | 8.00 | - | - | +3.00 | +0.50 |" in printed


def test_table1_magnitudes_come_from_the_main_runs_matrix(tmp_path, capsys):
    rows = ["full", "clustered-100", "clustered-200", "i-clustered-100", "i-clustered-200", "oracle-top"]
    pers = {"full": 0.05, "clustered-100": 0.20, "clustered-200": 0.10, "i-clustered-100": 0.06,
            "i-clustered-200": 0.055, "oracle-top": 0.08}
    main_point = {"step": 4000, "per": pers, "mean_entropy": 0.5,
                  "gap_to_full": {row: value - 0.05 for row, value in pers.items() if row != "full"},
                  "layers": [layer(0.5, 0.2, 0.4, 0.1)], "per_by_layer": None, "gap_by_layer": None}
    main = write_run(tmp_path / "main", [main_point], rows=rows)
    (main / "matrix").mkdir()
    (main / "matrix" / "matrix.json").write_text(json.dumps({"columns": [{"label": "step4000"}], "rows": [
        {"evaluate_with": row, "cells": {"step4000": {"per": value, "valid": True}}} for row, value in pers.items()]}))
    assert attribution.main(["--main", str(main), "--out", str(tmp_path / "out")]) == 0
    printed = capsys.readouterr().out
    assert "| clustered-100 | 44.88 | +39.74 | clustered-100 | 20.00 | +15.00 |" in printed
    assert "the paper's gap (both aims)**: reproduced here" in printed


def test_errors_name_the_folder_and_what_to_do(three_runs, capsys):
    root, main, front, _ = three_runs
    other = write_run(root / "limited", [point(1000, 0.3, 0.3, 0.3)], limit=4)
    (root / "broken").mkdir()
    (root / "broken" / "sharpening.json").write_text('{"points": [')       # cut short
    cases = [(["--control", f"front end={root / 'nowhere'}"], "nowhere/sharpening.json does not exist"),
             (["--control", str(front)], "give SETTING=FOLDER"),
             (["--control", f"main={front}"], "names the --main run"),
             (["--control", f"a={front}", "--control", f"a={front}"], "give each control its own name"),
             (["--control", f"limited={other}"], "other limit than"),
             (["--control", f"broken={root / 'broken'}"], "broken/sharpening.json is not a sharpening.json")]
    for extra, message in cases:
        assert attribution.main(["--main", str(main), *extra, "--out", str(root / "out")]) == 2
        assert message in capsys.readouterr().err
    assert not (root / "out").exists()          # nothing written before the inputs are known good


def test_a_step_measured_before_a_measure_existed_shows_none_for_it():
    """sharpening.json files published before the layer error and the attention share were measured."""
    older = point(1000, 0.2, 0.21, 0.2)
    for measures in older["layers"]:
        del measures["clustering_layer_error"], measures["attention_share"]
    summary = attribution.step_summary(older, "clustered-100")
    assert summary["mean_clustering_layer_error"] is None and summary["mean_attention_share"] is None
    assert summary["mean_clustering_output_error"] == pytest.approx(0.03)

"""recipes.synth.experiment's check of the paper's findings, on a hand-made matrix with a known verdict."""
from recipes.synth.experiment import SPECS, format_findings, paper_findings

COLUMNS = ["full", "shared_full", "lsh1", "lsh4", "clustered", "iclustered"]
NEEDS_SHARED_QK = {"shared-full", "lsh-1", "lsh-4"}
SHARED_QK_MODELS = {"shared_full", "lsh1", "lsh4"}


def matrix(per):
    """matrix.json rows from per(row, column) -> PER; pairs that need shared QK on other models are invalid."""
    rows = []
    for spec in SPECS:
        cells = {}
        for column in COLUMNS:
            valid = spec not in NEEDS_SHARED_QK or column in SHARED_QK_MODELS
            cells[column] = {"valid": valid, "per": per(spec, column) if valid else None}
        rows.append({"evaluate_with": spec, "cells": cells})
    return {"columns": [{"label": column} for column in COLUMNS], "rows": rows}


def paper_like(spec, column):
    """Table 1's pattern: i-clustered < clustered, 64 < 32, lsh bad on shared_full, oracle-top worse."""
    base = {"full": 0.10, "shared-full": 0.10, "lsh-1": 0.70, "lsh-4": 0.60, "clustered-32": 0.45,
            "clustered-64": 0.25, "i-clustered-32": 0.15, "i-clustered-64": 0.12, "oracle-top": 0.30}
    return base[spec]


def test_every_finding_holds_on_a_matrix_shaped_like_table_1():
    findings = paper_findings(matrix(paper_like))
    assert [item["holds"] for item in findings] == [True, True, True, True]
    assert [item["compared"] for item in findings] == [4, 12, 4, 6]
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

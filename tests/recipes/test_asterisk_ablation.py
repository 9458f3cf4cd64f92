"""recipes.asterisk.ablation: every row's overrides compose to a valid training config that differs
from the SpecAugment-only row (the demo before issue 26) in exactly what the row says; the table and
the plot."""
import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "asr"))
from tiny_runs import compose_config  # noqa: E402

from asr.config.schema import register_schema, validate_config  # noqa: E402
from recipes.asterisk import ablation  # noqa: E402

register_schema()


def flat(node, prefix=""):
    out = {}
    for key, value in node.items():
        if isinstance(value, dict):
            out.update(flat(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = value
    return out


@pytest.fixture(scope="module")
def before_config():
    from omegaconf import OmegaConf
    return flat(OmegaConf.to_container(compose_config(f"conf={ablation.PRESET}", *ablation.BEFORE), resolve=True))


@pytest.mark.parametrize("row", list(ablation.ROWS))
def test_each_row_changes_only_its_augmentation(row, before_config):
    from omegaconf import OmegaConf
    base = before_config
    cfg = compose_config(f"conf={ablation.PRESET}", *ablation.row_overrides(row))
    validate_config(cfg)
    changed = {key for key, value in flat(OmegaConf.to_container(cfg, resolve=True)).items() if base.get(key) != value}
    expected = {override.split("=")[0] for override in ablation.ROWS[row][1]}
    assert changed == expected, row


def test_table_and_plot(tmp_path):
    results = [{"row": row, "description": ablation.ROWS[row][0], "steps": 10, "synth_test_per": 0.1 * i,
                "asterisk_dev_per": 0.5, "asterisk_test_per": 0.6, "asterisk_test_wer": 0.9,
                "seconds_per_step": 0.25, "load_average": 1.5} for i, row in enumerate(ablation.ROWS)]
    table = ablation.format_table(results).splitlines()
    assert table[0] == "| row | " + " | ".join(ablation.COLUMNS) + " |"
    assert table[2] == "| no augmentation | 0.0 | 50.0 | 60.0 | 90.0 | 0.25 | 1.5 |"
    assert len(table) == 2 + len(ablation.ROWS)
    ablation.plot(results, tmp_path / "a.png")
    assert (tmp_path / "a.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    json.dumps(results)


def test_a_step_budget_below_one_is_refused(capsys):
    assert ablation.main(["--steps", "0", "--out", "/nonexistent"]) == 2
    assert "--steps=0 must be >= 1" in capsys.readouterr().err


def test_earlier_rows_are_kept_unless_measured_again_or_of_another_budget(tmp_path):
    earlier = [{"row": "specaugment", "steps": 2000}, {"row": "channel", "steps": 2000},
               {"row": "all", "steps": 600}, {"row": "retired_row", "steps": 2000}]
    (tmp_path / "ablation.json").write_text(json.dumps(earlier))
    kept = ablation.earlier_rows(tmp_path / "ablation.json", exclude=["channel", "none"], steps=2000)
    assert kept == [{"row": "specaugment", "steps": 2000}]
    assert ablation.earlier_rows(tmp_path / "missing.json", exclude=[], steps=2000) == []

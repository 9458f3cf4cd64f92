"""`python -m asr.train --help` describes every key of the schema, from the schema's own comments."""
from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
import typing
from dataclasses import dataclass, field

from asr.config.schema import TrainConfig
from asr.config.help import field_descriptions, schema_keys
from tiny_runs import ROOT


def leaf_keys(schema: type, prefix: str = "") -> list[str]:
    """Every key of the schema, walked independently of asr.config.help."""
    keys = []
    hints = typing.get_type_hints(schema)
    for item in dataclasses.fields(schema):
        if dataclasses.is_dataclass(hints[item.name]):
            keys += leaf_keys(hints[item.name], prefix + item.name + ".")
        else:
            keys.append(prefix + item.name)
    return keys


def test_every_schema_key_has_a_description_and_its_default():
    rows = {key: (kind, default, description) for key, kind, default, description in schema_keys(TrainConfig)}
    assert sorted(rows) == sorted(leaf_keys(TrainConfig))
    undescribed = [key for key, (_, _, description) in rows.items() if len(description) < 8]
    assert not undescribed, f"give these schema fields a comment: {undescribed}"
    assert rows["model.layers"][:2] == ("int", "9")
    assert rows["trainer.max_minutes"][:2] == ("float | null", "null")
    assert rows["data.targets"][1] == '["phones", "chars"]'


@dataclass
class Sample:
    # a comment above,
    # on two lines
    above: int = 1
    trailing: str = "x"   # the trailing one
    both: float = 2.0     # trailing wins
    bare: bool = False
    listed: typing.List[int] = field(default_factory=list)  # with a factory


def test_descriptions_are_the_comment_on_the_line_or_the_lines_above():
    assert field_descriptions(Sample) == {"above": "a comment above, on two lines", "trailing": "the trailing one",
                                          "both": "trailing wins", "listed": "with a factory"}


def test_help_lists_every_key_with_its_description():
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    result = subprocess.run([sys.executable, "-m", "asr.train", "--help"], cwd=ROOT, env=env,
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    for key, kind, default, description in schema_keys(TrainConfig):
        assert f"  {key} ({kind}, default {default}): {description}" in result.stdout
    assert "trainer: default, gpu, gpu80, synth" in result.stdout    # the groups, as Hydra lists them

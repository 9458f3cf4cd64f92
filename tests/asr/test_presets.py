"""Every preset name composes to the config it composed to before presets were generated.

tests/asr/preset_configs.json holds the resolved config of each of the 41 presets as the 41
hand-written files of conf/conf/ composed them (captured from that code, before it changed). The
presets are now made from a corpus file and an attention (asr/config/presets.py); this test holds the
new mechanism to the old files' result, name by name, value by value.

A change that means to change what presets compose to (a new schema key, a new default) changes
this fixture in the same commit: rewrite it with `python tests/asr/test_presets.py --rewrite` and
read the diff.
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from asr.config.presets import corpus_setups, preset_names
from tiny_runs import compose_config

FIXTURE = Path(__file__).with_name("preset_configs.json")
EXPECTED = json.loads(FIXTURE.read_text())


def resolved(preset: str) -> dict:
    return OmegaConf.to_container(compose_config(f"conf={preset}"), resolve=True)


def test_every_preset_name_of_before_is_still_one_and_so_is_every_corpus_setup():
    # (a new attention or corpus adds names: its presets compose and validate in
    # tests/recipes/test_presets_on_fixtures.py, without an entry here)
    assert set(EXPECTED) | set(corpus_setups()) <= set(preset_names())


@pytest.mark.parametrize("corpus", corpus_setups())
def test_a_corpus_setup_alone_is_its_full_attention_preset(corpus):
    assert resolved(corpus) == EXPECTED[f"{corpus}_full"]


@pytest.mark.parametrize("preset", sorted(EXPECTED))
def test_every_preset_composes_to_the_same_config(preset):
    assert resolved(preset) == EXPECTED[preset]


if __name__ == "__main__" and sys.argv[1:] == ["--rewrite"]:
    FIXTURE.write_text(json.dumps({name: resolved(name) for name in sorted(set(preset_names()) - set(corpus_setups()))},
                                  indent=1, sort_keys=True) + "\n")

"""Misspelt presets, group options and keys are named in one line, exit status 2 (asr.config.spelling)."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from asr import evaluate, transcribe, tune_lm
from asr.config.spelling import misspelt_train_override
from asr.core.errors import closest_name
from asr.core.exit_status import USAGE_ERROR

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("arguments, message", [
    (["conf=wsj_iclustred"], "conf=wsj_iclustred names no preset in conf/conf/; did you mean conf=wsj_iclustered?"),
    (["trainer.max_minuts=3"], "trainer.max_minuts is not a config key; did you mean trainer.max_minutes?"),
    (["+trainer.max_minuts=3"], "trainer.max_minuts is not a config key; did you mean trainer.max_minutes?"),
    (["trainr.max_minutes=3"], "trainr.max_minutes is not a config key; did you mean trainer.max_minutes?"),
    (["attention=clustred"], "attention=clustred names no file in conf/attention/; did you mean attention=clustered?"),
    (["atention=full"], "atention is not a config key; did you mean attention=full?"),
    (["data.num_mel_bin=40"], "data.num_mel_bin is not a config key; did you mean data.num_mel_bins?"),
    # the first mistake is named; the valid overrides before it are passed over
    (["conf=synth_full", "model.layers=2", "model.layer=2"],
     "model.layer is not a config key; did you mean model.layers?"),
])
def test_a_near_miss_names_what_was_meant(arguments, message):
    assert misspelt_train_override(arguments) == message


@pytest.mark.parametrize("arguments", [
    ["conf=wsj_iclustered", "trainer.max_minutes=3", "trainer=synth", "attention=clustered"],
    ["attention.clusters=3", "attention.clustrs=3"],   # attention's options: its registry checks them
    ["+model.loss_weights.words=2"],                   # a dict field's keys are free
    ["hydra.run.dir=/tmp/x", "~seed", "--help", "-m", "--cfg", "job"],
    ["model.nonsense=1", "conf=no_such_preset"],       # no near miss: Hydra's own message stays
])
def test_valid_or_far_off_arguments_get_no_suggestion(arguments):
    assert misspelt_train_override(arguments) is None


def test_closest_name_needs_a_close_match():
    assert closest_name("max_minuts", ["max_steps", "max_minutes", "max_epochs"]) == "max_minutes"
    assert closest_name("nonsense", ["layers", "heads", "dropout"]) is None


def run_train(*arguments: str, cwd: Path) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    return subprocess.run([sys.executable, "-m", "asr.train", *arguments], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=600)


@pytest.mark.parametrize("argument, line", [
    ("conf=wsj_iclustred", "asr.train: error: conf=wsj_iclustred names no preset in conf/conf/; "
                           "did you mean conf=wsj_iclustered?"),
    ("trainer.max_minuts=3", "asr.train: error: trainer.max_minuts is not a config key; "
                             "did you mean trainer.max_minutes?"),
])
def test_asr_train_says_it_in_one_line_and_exits_2(argument, line, tmp_path):
    result = run_train(argument, f"run_root={tmp_path}/runs", cwd=tmp_path)
    assert result.returncode == USAGE_ERROR
    assert result.stderr.strip().splitlines() == [line]
    assert not (tmp_path / "runs").exists()   # stopped before Hydra made a run folder


@pytest.mark.parametrize("command, arguments, line", [
    (evaluate, ["chekpoint=best.ckpt"], "asr.evaluate: error: chekpoint is not an argument; did you mean checkpoint?"),
    (evaluate, ["checkpoint=best.ckpt", "decodr=beam"],
     "asr.evaluate: error: decodr is not an argument; did you mean decoder?"),
    (transcribe, ["checkpoint=best.ckpt", "windw=10", "a.wav"],
     "asr.transcribe: error: windw is not an argument; did you mean window?"),
    (tune_lm, ["checkpoint=best.ckpt", "lm_weigts=[1]"],
     "asr.tune_lm: error: lm_weigts is not an argument; did you mean lm_weights?"),
])
def test_key_value_commands_name_the_argument_meant(command, arguments, line, capsys):
    assert command.main(arguments) == USAGE_ERROR
    assert capsys.readouterr().err.strip().splitlines() == [line]

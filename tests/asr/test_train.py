"""python -m asr.train: presets, config errors, run folders, resume; on a tiny generated corpus, tiny models."""
from __future__ import annotations

import csv
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from hydra.errors import ConfigCompositionException, MissingConfigException

from asr.config.schema import validate_config
from asr.core.errors import ConfigError
from asr.evaluation.evaluation import EvaluateConfig, evaluate, load_model
from asr.core.exit_status import INTERRUPTED, USAGE_ERROR
from asr.model.checkpoint import CheckpointError
from asr.model.recognizer import CheckpointMismatchError
from asr.config.presets import preset_names
from asr.model.run_folder import remove_unused_run_folder
from asr.training.fit import train
from attention_ext import AttentionConfigError
from tiny_runs import CONF, ROOT, TINY, compose_config, tiny_config

# The synth presets train here on the tiny synthetic corpus; the corpus presets (wsj_*, timit_*, ...)
# are composed, validated and trained on the recipe fixtures in tests/recipes/test_presets_on_fixtures.py.
# (synth_longform goes on from a trained model: its own test below; synth_paper_encoder validates every
# 1000 steps and trains to a plateau: tests/asr/test_plateau_stop.py)
PRESETS = [name for name in preset_names()
           if name.startswith("synth_") and name not in ("synth_longform", "synth_paper_encoder")]

def metrics_rows(run_dir: Path) -> list[dict]:
    rows = []
    for path in sorted(run_dir.glob("logs/version_*/metrics.csv")):
        with open(path) as f:
            rows += list(csv.DictReader(f))
    return rows


def train_losses(run_dir: Path) -> dict[int, float]:
    return {int(r["step"]): float(r["train/loss"]) for r in metrics_rows(run_dir) if r.get("train/loss")}


# ---- every preset ------------------------------------------------------------------------------
@pytest.mark.parametrize("preset", PRESETS)
def test_every_preset_trains_validates_and_tests(preset, tiny_synth, tmp_path):
    cfg = tiny_config(tiny_synth, f"conf={preset}")
    results = train(cfg, tmp_path / "run")
    run = tmp_path / "run"
    assert results["attention"] == cfg.attention.name and results["steps"] >= 1
    assert (run / "checkpoints" / "best.ckpt").is_file() and (run / "checkpoints" / "last.ckpt").is_file()
    assert (run / "config.yaml").is_file() and metrics_rows(run)
    saved = json.loads((run / "results.json").read_text())
    assert set(saved["test"]) >= {"per", "wer", "cer", "encoder_length"} and saved["parameters"] > 0
    assert saved["seconds_per_epoch"] > 0
    # the encoder really ran with the preset's attention, and the checkpoint says so
    checkpoint = torch.load(run / "checkpoints" / "best.ckpt", map_location="cpu", weights_only=True)
    assert checkpoint["hyper_parameters"]["attention"]["name"] == cfg.attention.name
    assert checkpoint["hyper_parameters"]["model"]["shared_qk"] == (preset in
                                                                   ("synth_shared_full", "synth_lsh1", "synth_lsh4"))
    # the test rates asr.train reports are what asr.evaluate gives for its best checkpoint (same seed
    # of the attention's randomness, whatever the attention)
    report = evaluate(EvaluateConfig(checkpoint=str(run / "checkpoints" / "best.ckpt"), out=str(tmp_path / "eval"),
                                     progress=False))
    assert {m: report["error_rates"][m] for m in ("per", "wer", "cer")} == {m: saved["test"][m]
                                                                          for m in ("per", "wer", "cer")}


def test_synth_longform_goes_on_from_a_trained_model_on_joined_examples(tiny_synth, tmp_path):
    """conf=synth_longform init_from=RUN: the model (positions included) and attention are the
    trained run's, the weights start from it, and the training examples are joined utterances."""
    first = tmp_path / "first"
    train(tiny_config(tiny_synth, "conf=synth_iclustered", "model.positions=sinusoidal_offset", "test=false"), first)
    cfg = tiny_config(tiny_synth, "conf=synth_longform", f"init_from={first}", "data.join_seconds=20",
                      "test=false", "trainer.max_steps=2", "trainer.record_batches=true")
    train(cfg, tmp_path / "second")
    stored = (tmp_path / "second" / "config.yaml").read_text()
    assert "positions: sinusoidal_offset" in stored and "join_by: none" in stored
    checkpoint = torch.load(tmp_path / "second" / "checkpoints" / "last.ckpt", map_location="cpu", weights_only=True)
    assert checkpoint["hyper_parameters"]["model"]["positions"] == "sinusoidal_offset"
    assert checkpoint["hyper_parameters"]["attention"] == {"name": "iclustered", "clusters": 64, "bits": 63,
                                                           "iterations": 10, "topk": 32}
    records = [json.loads(line) for line in (tmp_path / "second" / "batches" / "rank0.jsonl").read_text().splitlines()]
    assert any("+" in example for record in records for example in record["ids"])


def test_presets_cover_the_attention_types():
    assert {"synth_full", "synth_shared_full", "synth_lsh1", "synth_lsh4", "synth_clustered",
            "synth_iclustered", "synth_linear", "synth_agglomerative"} <= set(PRESETS)
    default = compose_config()
    assert default.attention.name == "iclustered"          # python -m asr.train with no argument


def test_default_preset_uses_at_most_a_quarter_as_many_clusters_as_encoder_positions():
    """The synth utterances last ~7.8 s on average (recipes/synth/README.md): 780 frames, 390 positions
    after the stride-2 front end."""
    cfg = compose_config()
    positions = 780 / cfg.model.subsampling
    assert positions >= 250 and cfg.attention.clusters <= positions / 4


# ---- resume ------------------------------------------------------------------------------------
def test_resume_continues_with_the_same_steps_and_losses(tiny_synth, tmp_path):
    common = ("conf=synth_full", "data.specaugment=false")
    whole = tmp_path / "whole"
    train(tiny_config(tiny_synth, *common, "trainer.max_epochs=2"), whole)
    interrupted = tmp_path / "interrupted"
    train(tiny_config(tiny_synth, *common, "trainer.max_epochs=1", "test=false"), interrupted)
    first_part = train_losses(interrupted)
    resumed = train(tiny_config(tiny_synth, *common, "trainer.max_epochs=2", "ckpt_path=last"), interrupted)
    expected, got = train_losses(whole), train_losses(interrupted)
    assert len(list(interrupted.glob("logs/version_*"))) == 2     # one log version per start
    assert set(got) == set(expected) and max(got) > max(first_part)   # the same steps, and it went on
    for step in expected:
        assert got[step] == pytest.approx(expected[step], rel=1e-5), step
    assert resumed["steps"] == json.loads((whole / "results.json").read_text())["steps"]


def test_checkpoints_of_fixed_steps_are_kept_and_a_resumed_run_keeps_their_schedule(tiny_synth, tmp_path):
    run = tmp_path / "run"
    common = ("conf=synth_full", "trainer.keep_checkpoints_every_n_steps=3", "test=false")

    def kept() -> dict[str, int]:
        """checkpoint file -> the global step stored in it"""
        return {path.name: torch.load(path, map_location="cpu", weights_only=True)["global_step"]
                for path in (run / "checkpoints").iterdir()}

    def expected(steps: int) -> dict[str, int]:
        return {f"step-{step:06d}.ckpt": step for step in range(3, steps + 1, 3)}

    first = train(tiny_config(tiny_synth, *common, "trainer.max_epochs=1"), run)
    assert first["steps"] % 3 != 0       # the resumed run starts between two kept steps
    files = kept()
    assert {name: step for name, step in files.items() if name.startswith("step-")} == expected(first["steps"])
    assert set(files) == {*expected(first["steps"]), "best.ckpt", "last.ckpt"}
    resumed = train(tiny_config(tiny_synth, *common, "trainer.max_epochs=3", "ckpt_path=last"), run)
    assert resumed["steps"] >= first["steps"] + 6
    files = kept()
    assert {name: step for name, step in files.items() if name.startswith("step-")} == expected(resumed["steps"])
    assert set(files) == {*expected(resumed["steps"]), "best.ckpt", "last.ckpt"}


# ---- the step budget's end -----------------------------------------------------------------------
def test_a_step_budget_that_ends_inside_an_epoch_validates_and_checkpoints_its_last_steps(tiny_synth, tmp_path):
    """The tiny corpus's epoch is 4 steps; a budget of 6 ends 2 steps into the second epoch. Those
    steps are validated, and the best checkpoint is chosen among both validations."""
    run = tmp_path / "run"
    results = train(tiny_config(tiny_synth, "conf=synth_full", "trainer.max_epochs=5", "trainer.max_steps=6",
                                "test=false"), run)
    assert results["steps"] == 6
    validations = [row for row in metrics_rows(run) if row.get("val/per")]
    # Lightning logs a validation under the index of the step that preceded it
    assert [int(row["step"]) for row in validations] == [3, 5]
    last = torch.load(run / "checkpoints" / "last.ckpt", map_location="cpu", weights_only=True)
    assert last["global_step"] == 6
    assert last["val_error_rates"]["per"] == pytest.approx(float(validations[-1]["val/per"]))   # this step's, not epoch 0's
    errors = [float(row["val/primary_error"]) for row in validations]
    assert results["best_val_primary_error"] == pytest.approx(min(errors))
    best = torch.load(run / "checkpoints" / "best.ckpt", map_location="cpu", weights_only=True)
    assert best["global_step"] == (4, 6)[errors.index(min(errors))]   # the first of equal errors is kept
    # a budget that ends with an epoch validates once there, as before
    whole_epoch = tmp_path / "whole_epoch"
    train(tiny_config(tiny_synth, "conf=synth_full", "trainer.max_epochs=5", "trainer.max_steps=4", "test=false"),
          whole_epoch)
    assert [int(row["step"]) for row in metrics_rows(whole_epoch) if row.get("val/per")] == [3]


def test_resume_from_a_model_of_another_shape_names_the_tensors(tiny_synth, tmp_path):
    run = tmp_path / "run"
    train(tiny_config(tiny_synth, "conf=synth_full", "trainer.max_steps=1", "test=false"), run)
    with pytest.raises(CheckpointMismatchError) as error:
        train(tiny_config(tiny_synth, "conf=synth_full", "model.ff_dim=48", "ckpt_path=last"), run)
    assert "encoder.layers.0.ff.0.weight: (32, 16) in the checkpoint, (48, 16) here" in str(error.value)
    # a fresh run (no ckpt_path) does not overwrite the checkpoints of another
    with pytest.raises(ConfigError, match="already holds checkpoints of an earlier run; resume it with ckpt_path=last"):
        train(tiny_config(tiny_synth, "conf=synth_full"), run)


def test_resume_from_a_file_that_is_not_a_checkpoint_names_it(tiny_synth, tmp_path):
    (tmp_path / "notes.ckpt").write_text("epoch 3 looked good\n")
    with pytest.raises(CheckpointError, match=f"checkpoint {tmp_path}/notes.ckpt is not a PyTorch checkpoint"):
        train(tiny_config(tiny_synth, "conf=synth_full", f"ckpt_path={tmp_path}/notes.ckpt"), tmp_path / "run")
    assert not (tmp_path / "run").exists()       # refused before the run folder got anything


def test_resume_without_an_earlier_run_says_what_to_do(tiny_synth, tmp_path):
    with pytest.raises(ConfigError, match="ckpt_path=last: no earlier run"):
        train(tiny_config(tiny_synth, "conf=synth_full", "ckpt_path=last"), tmp_path / "new")
    with pytest.raises(ConfigError, match="no such checkpoint file"):
        train(tiny_config(tiny_synth, "conf=synth_full", f"ckpt_path={tmp_path}/nope.ckpt"), tmp_path / "new")


# ---- config errors -----------------------------------------------------------------------------
def test_unknown_keys_and_wrong_types_fail_while_composing():
    with pytest.raises(ConfigCompositionException) as error:
        compose_config("model.nonsense=1")
    assert "model.nonsense" in str(error.value)
    assert "Key 'nonsense' not in 'ModelConfig'" in str(error.value.__cause__)
    with pytest.raises(ConfigCompositionException) as error:
        compose_config("model.layers=many")
    assert "could not be converted to Integer" in str(error.value.__cause__)
    with pytest.raises(MissingConfigException, match="synth_iclustered"):   # lists the presets
        compose_config("conf=no_such_preset")


@pytest.mark.parametrize("overrides, error, message", [
    (["model.subsampling=3"], ConfigError, "model.subsampling=3 is not allowed: must be 1, 2 or 4"),
    (["model.dropout=1.5"], ConfigError, r"model.dropout=1.5 is not allowed: must lie in \[0, 1\)"),
    (["optim.lr=0"], ConfigError, "optim.lr=0.0 is not allowed"),
    (["trainer.keep_checkpoints_every_n_steps=0"], ConfigError,
     "trainer.keep_checkpoints_every_n_steps=0 is not allowed: must be a number of optimiser steps >= 1"),
    (["+model.loss_weights.words=2"], ConfigError, r"model.loss_weights.words=2.0 is not allowed: names no target"),
    (["optim.plateau_target=words"], ConfigError, r"optim.plateau_target='words' is not allowed: names no target"),
    (["optim.plateau_target=phones"], None, None),
    (["data.num_mel_bins=41"], ConfigError, "data.num_mel_bins=41; choose 40"),
    (["attention.name=fancy"], AttentionConfigError, "unknown attention 'fancy'; allowed names and options"),
    (["attention=full", "+attention.clusters=3"], AttentionConfigError, "attention 'full' has no option clusters"),
    (["attention=full"], None, None),   # a preset's attention can be swapped for one without options
    (["attention.clusters=0"], AttentionConfigError, "clusters=0 is out of range"),
    (["conf=synth_full", "attention=lsh"], AttentionConfigError, "needs shared query/key projections"),
    (["conf=synth_agglomerative", "model.head_dim=4"], AttentionConfigError,
     r"classes=8 exceeds the head dim 4.*model.head_dim >= 8"),
])
def test_bad_values_are_refused_at_start_up_with_the_fix(overrides, error, message):
    if error is None:
        validate_config(compose_config(*overrides))
        return
    with pytest.raises(error, match=message):
        validate_config(compose_config(*overrides))


def test_every_preset_passes_validation():
    for preset in PRESETS:
        validate_config(compose_config(f"conf={preset}"))


# ---- the command line --------------------------------------------------------------------------
def run_cli(*arguments: str, cwd: Path) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    return subprocess.run([sys.executable, "-m", "asr.train", *arguments], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=600)


def test_cli_config_errors_exit_2_without_a_traceback_or_a_run_folder(tmp_path):
    unknown = run_cli("model.nonsense=1", f"run_root={tmp_path}/runs", cwd=tmp_path)   # Hydra's composition
    assert unknown.returncode == USAGE_ERROR
    assert "Could not override 'model.nonsense'" in unknown.stderr
    assert "Key 'nonsense' not in 'ModelConfig'" in unknown.stderr
    bad = run_cli("model.subsampling=3", f"run_root={tmp_path}/runs", cwd=tmp_path)     # our validation
    assert bad.returncode == USAGE_ERROR
    assert bad.stderr.strip().splitlines() == ["asr.train: error: model.subsampling=3 is not allowed: must be 1, 2 or 4"]
    (tmp_path / "notes.ckpt").write_text("epoch 3 looked good\n")
    not_a_checkpoint = run_cli(f"ckpt_path={tmp_path}/notes.ckpt", f"run_root={tmp_path}/runs", cwd=tmp_path)
    assert not_a_checkpoint.returncode == USAGE_ERROR
    assert not_a_checkpoint.stderr.strip().splitlines() == [
        f"asr.train: error: checkpoint {tmp_path}/notes.ckpt is not a PyTorch checkpoint (not the zip archive "
        "torch.save writes: truncated, or another kind of file)"]
    assert list((tmp_path / "runs").iterdir()) == []     # Hydra made run folders; they are gone again


def test_only_a_run_folder_that_holds_nothing_of_the_run_is_removed(tmp_path):
    def hydra_made(folder: Path, *files: str) -> Path:
        (folder / ".hydra").mkdir(parents=True)
        (folder / ".hydra" / "overrides.yaml").write_text("- model.subsampling=3\n")
        for name in ("train.log", *files):
            (folder / name).parent.mkdir(parents=True, exist_ok=True)
            (folder / name).write_text("")
        return folder
    fresh = hydra_made(tmp_path / "runs" / "synth_full" / "2026-01-01_00-00-00", "config.yaml",
                       "decoding/lexicon.txt")   # the corpus's lexicon, copied before the data failed
    remove_unused_run_folder(fresh, None)
    assert not (tmp_path / "runs" / "synth_full").exists() and (tmp_path / "runs").is_dir()
    trained = hydra_made(tmp_path / "runs" / "synth_full" / "2026-01-01_00-00-01", "checkpoints/last.ckpt")
    logged = hydra_made(tmp_path / "runs" / "synth_full" / "2026-01-01_00-00-02", "logs/version_0/metrics.csv")
    for folder in (trained, logged):
        remove_unused_run_folder(folder, None)
        assert folder.is_dir()
    named = hydra_made(tmp_path / "mine" / "run")
    remove_unused_run_folder(named, str(named))
    assert not named.exists() and (tmp_path / "mine").is_dir()    # run_dir=: the folder above is the user's


def test_ctrl_c_exits_130_with_the_command_that_resumes_the_run(tiny_synth, tmp_path):
    arguments = ["conf=synth_full", *TINY, f"data.root={tiny_synth}", f"run_root={tmp_path}/runs",
                 "trainer.max_epochs=1000"]
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    # A non-interactive shell starts `command &` with SIGINT ignored, and a Python started so keeps it
    # ignored and passes that on: a suite launched in the background (as CI may) gave a child that
    # never saw the Ctrl-C. A user's interactive shell starts asr.train with the default disposition;
    # so does this test.
    process = subprocess.Popen([sys.executable, "-m", "asr.train", *arguments], cwd=tmp_path, env=env,
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                               preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    deadline = time.monotonic() + 300
    while not list((tmp_path / "runs").glob("synth_full/*/checkpoints/last.ckpt")):   # an epoch finished
        assert process.poll() is None and time.monotonic() < deadline
        time.sleep(0.2)
    # Ctrl-C mid-epoch, as a user's would land; the stderr tail says where, should it outlive the signal
    time.sleep(1.0)
    process.send_signal(signal.SIGINT)
    try:
        _, stderr = process.communicate(timeout=120)
    except subprocess.TimeoutExpired:
        process.kill()
        _, stderr = process.communicate()
        pytest.fail(f"asr.train still ran 120 s after Ctrl-C; its stderr ended:\n{stderr[-3000:]}")
    assert process.returncode == INTERRUPTED
    assert "Traceback" not in stderr
    run, = (tmp_path / "runs" / "synth_full").iterdir()
    hint = stderr.strip().splitlines()[-1]
    assert hint.startswith("asr.train: interrupted; resume from its last checkpoint with: python -m asr.train ")
    assert hint.endswith(f" run_dir={run.relative_to(tmp_path)} ckpt_path=last")   # relative to where it ran
    assert " ".join(arguments) in hint
    assert (run / "train.log").read_text().rstrip().endswith(hint)   # why the run stopped, in its log too


def test_cli_trains_tests_prints_and_resumes_in_the_run_folder(tiny_synth, tmp_path):
    arguments = ["conf=synth_full", *TINY, f"data.root={tiny_synth}", f"run_root={tmp_path}/runs"]
    first = run_cli(*arguments, cwd=tmp_path)
    assert first.returncode == 0, first.stderr[-3000:]
    runs = list((tmp_path / "runs" / "synth_full").iterdir())
    assert len(runs) == 1
    run = runs[0]
    results = json.loads((run / "results.json").read_text())
    per, wer = 100 * results["test"]["per"], 100 * results["test"]["wer"]
    assert f"test: PER {per:.2f}%  WER {wer:.2f}%" in first.stdout
    assert (run / ".hydra" / "overrides.yaml").is_file()
    # train.log holds what the console showed (no bars here), Lightning's lines included, through why
    # training stopped and the test result, and every test metric
    train_log = (run / "train.log").read_text()
    for line in (first.stdout + first.stderr).splitlines():
        if line.strip():
            assert line.strip() in train_log, line
    for name, value in results["test"].items():
        assert re.search(rf"test/{name}\s+{re.escape(str(value))}$", train_log, re.MULTILINE), name
    assert "training stopped: trainer.max_epochs=1 epochs done" in train_log
    assert "GPU available" in train_log
    test_line = (f"test: PER {per:.2f}%  WER {wer:.2f}%  CER {100 * results['test']['cer']:.2f}%"
                 f"  (mean encoder length {results['test']['encoder_length']:.0f})")
    # the tiny synth corpus ships a lexicon and an LM, so the words decoded through them come last
    lexicon_line = (f"      lexicon + LM: WER {100 * results['test']['wer_lexicon']:.2f}%  "
                    f"CER {100 * results['test']['cer_lexicon']:.2f}%")
    assert train_log.rstrip().endswith(f"{test_line}\n{lexicon_line}")
    second = run_cli(*arguments, "trainer.max_epochs=2", "ckpt_path=last", cwd=tmp_path)
    assert second.returncode == 0, second.stderr[-3000:]
    assert list((tmp_path / "runs" / "synth_full").iterdir()) == [run]    # continued in the same folder
    assert json.loads((run / "results.json").read_text())["epochs"] == 2
    # what a user cannot act on is not printed (asr/core/warning_filters.py), in a fresh run nor a resumed one
    # nor what says again what asr.train says: Lightning's model table (FLOPs 0), its test table (each
    # rate under two or three names), its stop and checkpoint-loading lines
    for noise in ("LeafSpec", "litlogger", "Checkpoint directory", "val_check_interval", "Warning", "FLOPs",
                  "Test metric", "test/per", "`Trainer.fit` stopped", "Restoring states", "Loaded model weights",
                  "TPU available"):
        assert noise not in first.stdout + first.stderr + second.stdout + second.stderr, noise


def test_the_last_lines_print_each_rate_once_under_its_own_name():
    from asr.train import result_lines
    # as the recognizer names them: per head, the headline (phone head, first word head), the primary
    # error (= the phone head's PER), the lexicon + LM words; a second word head (sentencepiece)
    test = {"per_phones": 0.0458, "per": 0.0458, "wer_chars": 0.8181, "cer_chars": 0.2658, "wer_pieces": 0.7012,
            "cer_pieces": 0.2511, "wer": 0.8181, "cer": 0.2658, "primary_error": 0.0458, "wer_lexicon": 0.123,
            "cer_lexicon": 0.045, "encoder_length": 383.4, "oov_lm": 0.0}
    real = {"corpus": "asterisk", "per": 0.5912, "wer_lexicon": 0.6543, "oov_lm": 0.0321}
    lines = result_lines({"test": test, "real_speech": real})
    assert lines == ["test: PER 4.58%  WER 81.81%  CER 26.58%  (mean encoder length 383)",
                     "      lexicon + LM: WER 12.30%  CER 4.50%",
                     "      other heads: pieces WER 70.12% CER 25.11%",
                     "real speech (asterisk test): PER 59.12%  lexicon + LM: WER 65.43%  (words outside the LM 3.21%)"]
    printed = "\n".join(lines)
    for rate in {*test.values(), *[real[key] for key in ("per", "wer_lexicon", "oov_lm")]} - {383.4, 0.0}:
        assert printed.count(f"{100 * rate:.2f}%") == 1, rate
    assert result_lines({"test": {}}) == []     # test=false: no test line


def test_stop_reason_names_the_budget_that_ended_training():
    from types import SimpleNamespace

    from lightning.pytorch.callbacks import EarlyStopping, Timer

    from asr.training.fit import stop_reason

    def trainer(callbacks=(), max_steps=-1, max_epochs=1000, epoch=3, step=120):
        return SimpleNamespace(callbacks=list(callbacks), max_steps=max_steps, max_epochs=max_epochs,
                               current_epoch=epoch, global_step=step)
    budget = Timer(duration={"minutes": 15})
    budget.time_remaining = lambda stage="train": -0.4
    assert stop_reason(trainer([budget])) == "the time budget trainer.max_minutes=15 ran out after 3 epoch(s), 120 steps"
    early = EarlyStopping(monitor="val/primary_error", patience=4)
    early.stopped_epoch = 3
    assert stop_reason(trainer([early])).startswith("early stopping: no better val/primary_error for 4 validations")
    assert stop_reason(trainer(max_steps=120)) == "the step budget trainer.max_steps=120 was reached after 3 epoch(s), 120 steps"
    assert stop_reason(trainer(max_epochs=3)) == "trainer.max_epochs=3 epochs done (120 steps)"


# ---- trainer.compile ---------------------------------------------------------------------------
def test_compiled_training_takes_the_steps_of_an_eager_one(tiny_synth, tmp_path):
    """trainer.compile=true: two steps with the default attention (iclustered, random clustering
    inside the compiled graph) give the losses of the same run without compile (dropout off: the
    compiler draws dropout masks from its own generator), and the checkpoint loads into an
    uncompiled model, which exports."""
    common = ("conf=synth_iclustered", "model.dropout=0.0", "trainer.max_steps=2", "test=false")
    eager, compiled = tmp_path / "eager", tmp_path / "compiled"
    train(tiny_config(tiny_synth, *common), eager)
    torch._dynamo.utils.counters.clear()
    results = train(tiny_config(tiny_synth, *common, "trainer.compile=true"), compiled)
    assert torch._dynamo.utils.counters["stats"]["unique_graphs"] >= 1     # it did compile
    torch._dynamo.reset()
    assert results["steps"] == 2
    expected, got = train_losses(eager), train_losses(compiled)
    assert set(got) == set(expected) and len(got) == 2
    for step in expected:
        assert got[step] == pytest.approx(expected[step], rel=1e-4), step
    checkpoint = torch.load(compiled / "checkpoints" / "last.ckpt", map_location="cpu", weights_only=True)
    assert not any("_orig_mod" in key for key in checkpoint["state_dict"])
    # exported as asr/README.md shows, it gives what the eager model gives
    model = load_model(compiled / "checkpoints" / "last.ckpt")
    features, lengths = torch.randn(2, 120, model.hparams.feature_dim), torch.tensor([120, 90])
    with torch.no_grad():
        program = torch.export.export(model, (features, lengths))
        torch.manual_seed(1)
        expected, expected_lengths = model(features, lengths)
        torch.manual_seed(1)
        got, got_lengths = program.module()(features, lengths)
    assert torch.equal(got_lengths, expected_lengths) and got.keys() == expected.keys()
    for kind in expected:
        torch.testing.assert_close(got[kind], expected[kind])

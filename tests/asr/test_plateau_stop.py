"""Early stopping on a relative gain (asr.training.callbacks.RelativePlateauStop) and the preset that
trains the paper's encoder to its plateau (conf=synth_paper_encoder)."""
from __future__ import annotations

import csv
import logging
import math

import pytest
import torch
from lightning.pytorch.callbacks import EarlyStopping

from asr.config.schema import validate_config
from asr.core.errors import ConfigError
from asr.training.callbacks import RelativePlateauStop, ValidationLog
from asr.training.fit import stop_reason, train
from tiny_runs import compose_config, tiny_config


def decisions(values, patience=3, gain=0.02) -> list[bool]:
    rule = RelativePlateauStop("val/primary_error", patience, gain)
    return [rule.observe(value) for value in values]


def test_three_validations_without_a_two_percent_gain_stop_training():
    # 40 is the reference after the second validation; 39.5, 39.4 and 39.3 are each less than 2 %
    # below it (39.2 would be needed), so the third of them stops
    assert decisions([50.0, 40.0, 39.5, 39.4, 39.3]) == [False, False, False, False, True]
    # a gain of 2 % or more (39.1 < 40 x 0.98) resets the count; the next three without one stop
    assert decisions([50.0, 40.0, 39.5, 39.1, 39.0, 38.9, 38.8]) == [False] * 6 + [True]


def test_small_decreases_add_up_to_a_gain_against_the_reference():
    # 9.9 and 9.8 are not 2 % below 10 (9.8 is exactly 2 %: not below), 9.75 is: together they gain
    rule = RelativePlateauStop("val/primary_error", 3, 0.02)
    assert [rule.observe(v) for v in (10.0, 9.9, 9.8, 9.75)] == [False] * 4
    assert rule.reference == 9.75 and rule.wait == 0


def test_a_worse_or_missing_value_is_no_gain():
    assert decisions([10.0, 12.0, math.nan, 11.0], patience=3) == [False, False, False, True]
    # a NaN first: no reference yet, and the first number becomes it
    assert decisions([math.nan, 10.0, 10.0, 10.0], patience=2) == [False, False, False, True]


def test_validations_before_the_error_first_falls_below_the_start_count_for_nothing():
    # 99 % PER for four validations (CTC's all-blank start) would stop at the fourth without start_below
    values = [0.99, 0.99, 0.978, 0.99, 0.60, 0.59, 0.59, 0.59]
    assert decisions(values)[3] is True
    rule = RelativePlateauStop("val/primary_error", 3, 0.02, start_below=0.9)
    assert [rule.observe(v) for v in values] == [False] * 7 + [True]
    assert rule.reference == 0.60
    # a NaN before the start is not counted either
    rule = RelativePlateauStop("val/primary_error", 1, 0.02, start_below=0.9)
    assert [rule.observe(v) for v in (math.nan, 0.95, 0.5, 0.5)] == [False, False, False, True]


@pytest.mark.parametrize("values", [[5.0, 4.0, 4.0, 3.9, 3.95, 3.95, 3.95, 3.0],
                                    [9.0, 9.0, 8.0, 8.5, 7.9, 7.9, 7.9, 7.9]])
def test_a_gain_of_zero_stops_where_lightnings_early_stopping_does(values):
    lightning = EarlyStopping(monitor="val/primary_error", mode="min", patience=2)
    expected = []
    for value in values:
        expected.append(lightning._evaluate_stopping_criteria(torch.tensor(value))[0])
        if expected[-1]:
            break
    assert decisions(values, patience=2, gain=0.0)[:len(expected)] == expected


def test_a_resumed_run_goes_on_counting_from_its_checkpoint():
    values = [50.0, 40.0, 39.5, 39.4, 39.3]
    first = RelativePlateauStop("val/primary_error", 3, 0.02)
    for value in values[:3]:
        first.observe(value)
    resumed = RelativePlateauStop("val/primary_error", 3, 0.02)
    resumed.load_state_dict(first.state_dict())
    assert [resumed.observe(value) for value in values[3:]] == decisions(values)[3:]


def test_the_rule_says_where_its_count_stands():
    rule = RelativePlateauStop("val/primary_error", 3, 0.02, start_below=0.9)
    rule.observe(0.95)
    assert rule.standing() == "not begun (counting starts below 0.9)"
    rule.observe(0.5)
    rule.observe(0.495)
    assert rule.standing() == "1 of 3 validations without val/primary_error below 0.49 (2 % under 0.5)"


def test_the_validation_line_gives_the_rates_losses_best_and_lr():
    journal = ValidationLog()
    metrics = {"per": 0.3471, "per_phones": 0.3471, "primary_error": 0.3471, "wer": 0.8, "cer": 0.25,
               "loss": 3.38, "loss_phones": 0.4531, "loss_chars": 2.927, "encoder_length": 790.0}
    assert journal.line(3000, metrics, 1e-3) == (
        "validation at step 3000: PER 34.71 %, WER 80.00 %, CER 25.00 %; loss 3.38, loss_chars 2.927, "
        "loss_phones 0.4531; best primary error 34.71 % at step 3000; lr 0.001")
    # a worse validation keeps the best, a NaN never becomes it; the best survives a resume
    assert journal.line(4000, {**metrics, "primary_error": 0.36}, 5e-4).endswith(
        "best primary error 34.71 % at step 3000; lr 0.0005")
    resumed = ValidationLog()
    resumed.load_state_dict(journal.state_dict())
    assert resumed.line(5000, {"primary_error": math.nan}, 5e-4) == (
        "validation at step 5000: best primary error 34.71 % at step 3000; lr 0.0005")
    assert ValidationLog().line(1000, {"primary_error": math.nan}, 1e-3).endswith("best primary error none yet; lr 0.001")


def test_the_validation_line_gives_the_hours_trained_over_all_sittings(monkeypatch):
    clock = [1000.0]
    monkeypatch.setattr("asr.training.callbacks.time.monotonic", lambda: clock[0])
    first = ValidationLog()
    first.on_train_start(None, None)
    clock[0] += 2 * 3600
    assert first.line(1000, {"primary_error": 0.5}, 1e-3, first.trained_seconds()).endswith(
        "lr 0.001; trained 2.00 h in 1 sitting")
    clock[0] += 1800                     # the checkpoint of the first sitting, 2.5 h in
    saved = first.state_dict()
    assert saved["trained_seconds"] == 2.5 * 3600 and saved["sittings"] == 1
    second = ValidationLog()
    second.load_state_dict(saved)
    clock[0] += 12 * 3600                # a night between the sittings counts for nothing
    second.on_train_start(None, None)
    clock[0] += 900
    assert second.line(2000, {"primary_error": 0.4}, 1e-3, second.trained_seconds(), second.earlier_sittings + 1
                       ).endswith("trained 2.75 h in 2 sittings")
    # a checkpoint written before the hours were kept: counted from this sitting
    older = ValidationLog()
    older.load_state_dict({"best": (0.4, 2000)})
    assert older.earlier_seconds == 0.0 and older.earlier_sittings == 0


def test_stop_reason_names_the_relative_rule():
    from types import SimpleNamespace
    rule = RelativePlateauStop("val/primary_error", 3, 0.02)
    rule.stopped_step = 9000
    trainer = SimpleNamespace(callbacks=[rule], max_steps=-1, max_epochs=-1, current_epoch=21, global_step=9000)
    assert stop_reason(trainer) == ("early stopping: no 2 % relative gain in val/primary_error for 3 validations, "
                                    "after 21 epoch(s), 9000 steps")


@pytest.mark.parametrize("overrides, message", [
    (["trainer.early_stopping_min_relative_gain=0.02", "trainer.early_stopping_patience=null"],
     "needs trainer.early_stopping_patience"),
    (["trainer.early_stopping_min_relative_gain=1.5", "trainer.early_stopping_patience=3"], "must lie in [0, 1)"),
    (["trainer.check_val_every_n_epoch=null"], "null needs trainer.val_check_interval"),
    (["trainer.early_stopping_start_below=0.9"], "needs trainer.early_stopping_min_relative_gain"),
    (["conf=synth_paper_encoder", "trainer.early_stopping_start_below=1.5"], "must lie in (0, 1]"),
    (["trainer.check_val_every_n_epoch=0"], "must be a number of epochs >= 1"),
    (["conf=synth_paper_encoder", "model.norm=sandwich"], "model.norm='sandwich' is not allowed: must be one of pre, post"),
])
def test_bad_values_are_refused_with_the_fix(overrides, message):
    with pytest.raises(ConfigError, match=message.replace("[", r"\[").replace("(", r"\(").replace(")", r"\)")):
        validate_config(compose_config(*overrides))


def test_the_paper_encoder_preset_is_the_papers_encoder_with_the_plateau_rule():
    cfg = compose_config("conf=synth_paper_encoder")
    validate_config(cfg)
    model = cfg.model
    assert (model.layers, model.heads, model.head_dim, model.ff_dim) == (9, 6, 32, 768)
    assert (model.subsampling, model.positions, model.norm, cfg.attention.name) == (1, "sinusoidal", "post", "full")
    assert model.input_norm is True
    assert cfg.data.num_mel_bins == 40 and cfg.data.corpus == "synth"
    t = cfg.trainer
    assert (t.early_stopping_patience, t.early_stopping_min_relative_gain) == (3, 0.02)
    assert t.val_check_interval == 1000 and t.check_val_every_n_epoch is None
    assert t.keep_checkpoints_every_n_steps == 1000 and t.checkpoint_every_n_steps == 100
    assert t.early_stopping_start_below == 0.9
    assert (cfg.optim.lr, cfg.optim.warmup_steps, cfg.optim.plateau_target) == (1e-3, 1000, "phones")
    assert t.max_steps == -1 and t.max_epochs == -1 and t.max_minutes is None
    # the default presets do not change: pre-norm, Lightning's early stopping
    default = compose_config()
    assert default.model.norm == "pre" and default.model.input_norm is False
    assert default.trainer.early_stopping_min_relative_gain is None


def validations(run) -> list[tuple[int, float]]:
    rows = []
    for path in sorted(run.glob("logs/version_*/metrics.csv")):
        with open(path) as handle:
            rows += [(int(row["step"]), float(row["val/primary_error"])) for row in csv.DictReader(handle)
                     if row.get("val/primary_error")]
    return rows


def test_the_preset_validates_every_n_steps_across_epochs_keeps_its_checkpoints_and_stops_on_the_plateau(
        tiny_synth, tmp_path, caplog):
    """The tiny corpus's epoch is 4 steps: validation every 3 steps crosses epochs. A 99 % relative gain
    is never made, so the rule stops at the third validation (patience 2), step 9."""
    run = tmp_path / "run"
    cfg = tiny_config(tiny_synth, "conf=synth_paper_encoder", "trainer.val_check_interval=3",
                      "trainer.early_stopping_patience=2", "trainer.early_stopping_min_relative_gain=0.99",
                      "trainer.early_stopping_start_below=null",   # the tiny model never gets below 90 %
                      "trainer.keep_checkpoints_every_n_steps=2", "trainer.checkpoint_every_n_steps=2",
                      "trainer.max_epochs=-1", "trainer.max_steps=40", "test=false")
    with caplog.at_level(logging.INFO, logger="asr.train"):
        results = train(cfg, run)
    assert results["steps"] == 9
    # train.log's line per validation, at the steps done (3, 6, 9), with the PER that metrics.csv holds
    lines = [record.getMessage() for record in caplog.records if record.name == "asr.train"]
    validation_lines = [line for line in lines if line.startswith("validation at step")]
    assert [line.split(":")[0] for line in validation_lines] == [f"validation at step {s}" for s in (3, 6, 9)]
    assert [f"PER {100 * per:.2f} %" in line for line, (_, per) in zip(validation_lines, validations(run))] == [True] * 3
    assert all(line.endswith(" h in 1 sitting") for line in validation_lines)
    assert [line for line in lines if line.startswith("plateau rule at step")] == [
        "plateau rule at step 3: 0 of 2 validations without val/primary_error below "
        f"{validations(run)[0][1] * 0.01:.4g} (99 % under {validations(run)[0][1]:.4g})",
        "plateau rule at step 6: 1 of 2 validations without val/primary_error below "
        f"{validations(run)[0][1] * 0.01:.4g} (99 % under {validations(run)[0][1]:.4g})"]
    # Lightning logs a validation under the index of the step before it
    assert [step for step, _ in validations(run)] == [2, 5, 8]
    kept = {path.name: torch.load(path, map_location="cpu", weights_only=True)["global_step"]
            for path in (run / "checkpoints").glob("step-*.ckpt")}
    assert kept == {f"step-{step:06d}.ckpt": step for step in (2, 4, 6, 8)}
    last = torch.load(run / "checkpoints" / "last.ckpt", map_location="cpu", weights_only=True)
    assert last["hyper_parameters"]["model"]["norm"] == "post" and last["hyper_parameters"]["model"]["input_norm"]
    state = next(value for key, value in last["callbacks"].items() if "RelativePlateauStop" in key)
    assert state["wait"] == 2 and state["stopped_step"] == 9
    assert state["reference"] == pytest.approx(validations(run)[0][1])
    journal = next(value for key, value in last["callbacks"].items() if "ValidationLog" in key)
    best_step = 3 * (1 + [per for _, per in validations(run)].index(min(per for _, per in validations(run))))
    assert journal["best"] == (pytest.approx(min(per for _, per in validations(run))), best_step)
    assert journal["sittings"] == 1 and journal["trained_seconds"] > 0

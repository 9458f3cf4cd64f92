"""The training bar's length (the sampler's estimate of batches per epoch) and time budget."""
from __future__ import annotations

import math
import random
from types import SimpleNamespace

import pytest
from lhotse import CutSet
from lhotse.testing.dummies import dummy_cut

from asr.data.batching.duration_buckets import duration_bucketing_sampler
from asr.training.progress import EpochProgressBar, clock


def cuts_of(durations):
    return CutSet.from_cuts([dummy_cut(i, duration=d) for i, d in enumerate(durations)])


def drawn_batches(sampler) -> int:
    return sum(1 for _ in sampler)


@pytest.mark.parametrize("world_size, expected", [(1, 8), (2, 4), (3, 3)])
def test_estimate_of_equal_utterances_is_the_hand_count(world_size, expected):
    # 30 utterances of 2 s, one bucket bounded by 2.001 s, 10 s per batch: floor(10 / 2.001) = 4
    # per batch, ceil(30 / 4) = 8 batches, shared round by round: ceil(8 / ranks) per rank.
    sampler = duration_bucketing_sampler(cuts_of([2.0] * 30), 10.0, 1, shuffle=True, seed=0,
                                         rank=0, world_size=world_size)
    assert sampler.estimated_batches() == expected == math.ceil(8 / world_size)
    assert drawn_batches(sampler) == expected


@pytest.mark.parametrize("trial", range(6))
def test_estimate_matches_the_batches_drawn_for_random_durations(trial):
    rng = random.Random(trial)
    durations = [round(rng.uniform(0.5, 8.0), 2) for _ in range(rng.randint(20, 300))]
    world_size = rng.choice([1, 2, 4])
    sampler = duration_bucketing_sampler(cuts_of(durations), rng.choice([10.0, 20.0, 40.0]), rng.choice([1, 3, 6]),
                                         shuffle=True, seed=trial, rank=world_size - 1, world_size=world_size)
    sampler.set_epoch(2)
    assert sampler.estimated_batches() == drawn_batches(sampler)


def bar_on(num_training_batches, sampler=None, max_steps=-1, global_step=0, callbacks=(), max_epochs=10):
    bar = EpochProgressBar()
    bar._trainer = SimpleNamespace(num_training_batches=num_training_batches, max_epochs=max_epochs, max_steps=max_steps,
                                   global_step=global_step, train_dataloader=SimpleNamespace(sampler=sampler),
                                   callbacks=list(callbacks), progress_bar_metrics={}, loggers=[])
    return bar


def test_bar_total_is_the_estimate_when_lightning_has_none():
    sampler = duration_bucketing_sampler(cuts_of([2.0] * 30), 10.0, 1, shuffle=True, seed=0)
    assert bar_on(float("inf"), sampler).total_train_batches == 8
    assert bar_on(float("inf"), sampler, max_steps=20, global_step=17).total_train_batches == 3   # steps left
    assert bar_on(5, sampler).total_train_batches == 5      # Lightning knows (limit_train_batches): kept
    assert math.isinf(bar_on(float("inf"), None).total_train_batches)
    # a step budget without an epoch limit (every synth preset): the epoch's length, not the steps left
    assert bar_on(float("inf"), sampler, max_steps=2000, global_step=100, max_epochs=-1).total_train_batches == 8
    assert bar_on(float("inf"), sampler, max_steps=2000, global_step=1995, max_epochs=-1).total_train_batches == 5
    assert bar_on(float("inf"), None, max_steps=2000, global_step=100, max_epochs=-1).total_train_batches == 1900


def test_bar_shows_the_time_budget_left():
    from lightning.pytorch.callbacks import Timer

    timer = Timer(duration={"minutes": 15})
    timer.time_remaining = lambda stage="train": 754.6
    items = bar_on(float("inf"), callbacks=[timer]).get_metrics(
        SimpleNamespace(callbacks=[timer], progress_bar_metrics={}, loggers=[]), None)
    assert items["budget_left"] == "12:34"
    assert clock(3 * 3600 + 5 * 60 + 9) == "3:05:09" and clock(-3) == "0:00"


def test_validation_and_test_bars_take_the_estimate_too():
    sampler = duration_bucketing_sampler(cuts_of([2.0] * 30), 10.0, 1, shuffle=False, seed=0)
    bar = EpochProgressBar()
    bar._trainer = SimpleNamespace(sanity_checking=False, num_val_batches=[float("inf")],
                                   num_test_batches=[float("inf")], val_dataloaders=SimpleNamespace(sampler=sampler),
                                   test_dataloaders=[SimpleNamespace(sampler=sampler)])
    bar._current_eval_dataloader_idx = 0
    assert bar.total_val_batches_current_dataloader == 8 and bar.total_test_batches_current_dataloader == 8


class SteppingTrainer(SimpleNamespace):
    """What StepBudgetEstimate reads of a Trainer, with a step counter a test advances."""

    def __init__(self, max_steps: int, global_step: int = 0):
        super().__init__(max_steps=max_steps, global_step=global_step, is_global_zero=True,
                         progress_bar_callback=None, callbacks=[], progress_bar_metrics={}, loggers=[])


def run_steps(estimate, trainer, seconds_per_step: list[float], now: list[float]) -> None:
    """Advances the fake clock by each step's seconds and tells the callback the step ended."""
    for seconds in seconds_per_step:
        now[0] += seconds
        trainer.global_step += 1
        estimate.on_train_batch_end(trainer, None, None, None, 0)


def test_step_budget_estimate_leaves_out_the_first_steps_and_says_when_it_ends(caplog):
    from datetime import datetime

    from asr.training.progress import StepBudgetEstimate

    now = [100.0]
    estimate = StepBudgetEstimate(skip_steps=5, report_after_steps=20, clock=lambda: now[0],
                                  now=lambda: datetime(2026, 11, 26, 7, 0, 0))
    trainer = SteppingTrainer(max_steps=100)
    with caplog.at_level("INFO", logger="asr.training.progress"):
        run_steps(estimate, trainer, [30.0] * 5, now)          # start-up: slow, and left out
        assert estimate.seconds_left(trainer) is None
        run_steps(estimate, trainer, [2.0] * 15, now)          # steps 6-20 at 2 s each
    assert estimate.seconds_per_step() == 2.0
    assert estimate.seconds_left(trainer) == 2.0 * 80         # 80 steps left
    assert [record.getMessage() for record in caplog.records] == [
        "trainer.max_steps=100: 2.000 s/step over steps 6-20, so the 80 steps left take about 2:40 "
        "(until about 07:02), plus a validation per epoch and one at the end"]
    run_steps(estimate, trainer, [2.0] * 9 + [32.0], now)     # a validation of 30 s counts from then on
    assert estimate.seconds_per_step() == (15 * 2.0 + 9 * 2.0 + 32.0) / 25
    assert len(caplog.records) == 1                             # said once


def test_step_budget_estimate_of_a_resumed_run_and_on_the_bar():
    from datetime import datetime

    from asr.training.progress import StepBudgetEstimate

    now = [0.0]
    estimate = StepBudgetEstimate(skip_steps=2, report_after_steps=4, clock=lambda: now[0],
                                  now=lambda: datetime(2026, 11, 26, 7, 0, 0))
    trainer = SteppingTrainer(max_steps=1000, global_step=500)   # resumed at step 500
    run_steps(estimate, trainer, [9.0, 9.0, 0.5, 0.5], now)
    assert estimate.seconds_left(trainer) == 0.5 * 496
    trainer.callbacks = [estimate]
    assert bar_on(float("inf"), callbacks=[estimate]).get_metrics(trainer, None)["eta"] == "4:08"
    trainer.max_steps = -1                                         # no step budget: no estimate
    assert estimate.seconds_left(trainer) is None


def test_the_bar_of_an_epoch_resumed_in_the_middle_has_its_name_length_and_position(tiny_synth, tmp_path, capfd):
    """Lightning skips on_train_epoch_start for an epoch it resumes inside, where the bar is named and
    sized: it went on as `Training: 3/?`. Stopped by the step budget after 2 of the tiny epoch's 4 batches
    and resumed to 3 steps, the bar is epoch 0's, starts at batch 2 and ends at 3 of 3."""
    from asr.training.fit import train
    from tiny_runs import tiny_config

    common = ["trainer.enable_progress_bar=true", "trainer.checkpoint_every_n_steps=1", "trainer.max_epochs=-1",
              "trainer.val_check_interval=null", "test=false"]
    run = tmp_path / "run"
    train(tiny_config(tiny_synth, *common, "trainer.max_steps=2"), run)
    capfd.readouterr()
    train(tiny_config(tiny_synth, *common, "trainer.max_steps=3", "ckpt_path=last"), run)
    assert_bar_of_epoch_0_from_batch_2_to_3(capfd.readouterr().out)


def assert_bar_of_epoch_0_from_batch_2_to_3(stdout: str) -> None:
    frames = [frame for frame in stdout.replace("\r", "\n").splitlines()   # Lightning's bar: stdout
              if frame.startswith(("Epoch", "Training"))]
    # (Lightning prints the new bar once, `Training: 0/?`, before it is named)
    named = frames[next(index for index, frame in enumerate(frames) if frame.startswith("Epoch")):]
    assert all(frame.startswith("Epoch 0: ") for frame in named)
    assert any(" 2/3 [" in frame for frame in named) and " 3/3 [" in named[-1]


def test_the_bar_of_an_epoch_resumed_from_a_step_checkpoint_starts_at_its_batch(tiny_synth, tmp_path, capfd):
    """A checkpoint written after a step (trainer.keep_checkpoints_every_n_steps here; every N steps, a
    SIGTERM's) has that step's batch processed but not yet completed in Lightning's count: the bar
    started one batch early (`1/2` for the epoch's third batch)."""
    from asr.training.fit import train
    from tiny_runs import tiny_config

    common = ["trainer.enable_progress_bar=true", "trainer.max_epochs=-1", "trainer.val_check_interval=null",
              "test=false", "trainer.max_steps=3"]
    train(tiny_config(tiny_synth, *common, "trainer.keep_checkpoints_every_n_steps=2"), tmp_path / "run")
    capfd.readouterr()
    step_2 = tmp_path / "run" / "checkpoints" / "step-000002.ckpt"
    train(tiny_config(tiny_synth, *common, f"ckpt_path={step_2}"), tmp_path / "resumed")
    assert_bar_of_epoch_0_from_batch_2_to_3(capfd.readouterr().out)


def test_a_resumed_epochs_length_under_a_step_budget_counts_its_batches_already_run():
    sampler = duration_bucketing_sampler(cuts_of([2.0] * 30), 10.0, 1, shuffle=True, seed=0)   # 8 batches
    bar = bar_on(float("inf"), sampler, max_steps=20, global_step=17, max_epochs=-1)
    bar._resumed_batches = 2   # resumed at the epoch's third batch: 2 run, 3 steps left
    assert bar.total_train_batches == 5
    bar._resumed_batches = 6
    assert bar.total_train_batches == 8

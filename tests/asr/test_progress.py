"""The training bar's length (the sampler's estimate of batches per epoch) and time budget."""
from __future__ import annotations

import math
import random
from types import SimpleNamespace

import pytest
from lhotse import CutSet
from lhotse.testing.dummies import dummy_cut

from asr.data.batching import duration_bucketing_sampler
from asr.progress import EpochProgressBar, clock


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


def bar_on(num_training_batches, sampler=None, max_steps=-1, global_step=0, callbacks=()):
    bar = EpochProgressBar()
    bar._trainer = SimpleNamespace(num_training_batches=num_training_batches, max_epochs=10, max_steps=max_steps,
                                   global_step=global_step, train_dataloader=SimpleNamespace(sampler=sampler),
                                   callbacks=list(callbacks), progress_bar_metrics={}, loggers=[])
    return bar


def test_bar_total_is_the_estimate_when_lightning_has_none():
    sampler = duration_bucketing_sampler(cuts_of([2.0] * 30), 10.0, 1, shuffle=True, seed=0)
    assert bar_on(float("inf"), sampler).total_train_batches == 8
    assert bar_on(float("inf"), sampler, max_steps=20, global_step=17).total_train_batches == 3   # steps left
    assert bar_on(5, sampler).total_train_batches == 5      # Lightning knows (limit_train_batches): kept
    assert math.isinf(bar_on(float("inf"), None).total_train_batches)


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

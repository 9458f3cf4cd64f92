"""The training progress bar: Lightning's, with the length of an epoch and the budget's end.

Duration-bucketed batches have no length Lightning can read, so its bar shows `k/?` and no ETA.
`EpochProgressBar` gives the bar the sampler's estimate of the batches per epoch
(`EpochTaggedBucketingSampler.estimated_batches`), so tqdm shows `k/N [elapsed<remaining]` (the
validation and test bars too), and after the metrics the time to the end of training: with
`trainer.max_steps`, `eta=13:20`, estimated by `StepBudgetEstimate` from the steps run so far (which
also logs one line with that estimate after the first steps); with `trainer.max_minutes`, the
wall-clock budget left, `budget_left=12:34` (from Lightning's own Timer, which stops the run).
"""
from __future__ import annotations

import logging
import math
import time
from datetime import datetime, timedelta
from typing import Callable

from lightning.pytorch.callbacks import Callback, Timer, TQDMProgressBar

log = logging.getLogger(__name__)


def clock(seconds: float) -> str:
    """H:MM:SS or M:SS, as tqdm prints times."""
    seconds = max(0, int(seconds))
    hours, rest = divmod(seconds, 3600)
    return f"{hours}:{rest // 60:02d}:{rest % 60:02d}" if hours else f"{rest // 60}:{rest % 60:02d}"


def estimated_batches(loaders, index: int | None) -> int | float:
    """The sampler's estimate for a DataLoader (or the index-th of a list of them); inf without one."""
    if isinstance(loaders, (list, tuple)):
        loaders = loaders[index or 0] if loaders else None
    estimate = getattr(getattr(loaders, "sampler", None), "estimated_batches", None)
    return math.inf if estimate is None else estimate()


class EpochProgressBar(TQDMProgressBar):
    _resumed_batches = 0   # batches of the current epoch run before this sitting (a resumed epoch)

    def on_train_start(self, trainer, pl_module) -> None:
        super().on_train_start(trainer, pl_module)
        # A run resumed inside an epoch (from a step checkpoint, a SIGTERM's, or a step budget's end)
        # skips that epoch's on_train_epoch_start (Lightning 2.6), where the bar gets its name and
        # length; without them it read `Training: 291/?` and its rate counted the resumed batches as
        # run in this sitting's first seconds. Here it gets both, and its rate starts from them.
        loop = trainer.fit_loop
        if loop.restarted_mid_epoch or loop.restarted_on_epoch_end:
            # processed, as the data module counts the epoch's trained batches: a checkpoint written in
            # on_train_batch_end (every N steps, a SIGTERM's) has that batch processed, not yet completed
            self._resumed_batches = loop.epoch_loop.batch_progress.current.processed
            super().on_train_epoch_start(trainer, pl_module)
            self.train_progress_bar.initial = self.train_progress_bar.n = self._resumed_batches
            self.train_progress_bar.refresh()

    def on_train_epoch_start(self, trainer, *args) -> None:
        self._resumed_batches = 0
        super().on_train_epoch_start(trainer, *args)

    @property
    def total_train_batches(self) -> int | float:
        # Lightning's total is the loader's length or, with trainer.max_epochs=-1 and a step budget,
        # the steps left: not an epoch's length. The sampler's estimate stands in for a loader without one.
        batches = self.trainer.num_training_batches
        if math.isinf(batches):
            batches = estimated_batches(self.trainer.train_dataloader, 0)
        if math.isinf(batches):
            return super().total_train_batches
        max_steps = self.trainer.max_steps
        if max_steps is not None and max_steps > 0:   # the step budget may end this epoch early
            batches = min(batches, self._resumed_batches + max(1, max_steps - self.trainer.global_step))
        return batches

    @property
    def total_val_batches_current_dataloader(self) -> int | float:
        total = super().total_val_batches_current_dataloader
        if not math.isinf(total) or self.trainer.sanity_checking:
            return total
        return estimated_batches(self.trainer.val_dataloaders, self._current_eval_dataloader_idx)

    @property
    def total_test_batches_current_dataloader(self) -> int | float:
        total = super().total_test_batches_current_dataloader
        if not math.isinf(total):
            return total
        return estimated_batches(self.trainer.test_dataloaders, self._current_eval_dataloader_idx)

    def get_metrics(self, trainer, pl_module) -> dict:
        items = super().get_metrics(trainer, pl_module)
        items.pop("v_num", None)   # the log folder's version number, not a measurement
        estimate = next((callback for callback in trainer.callbacks if isinstance(callback, StepBudgetEstimate)), None)
        seconds = None if estimate is None else estimate.seconds_left(trainer)
        if seconds is not None:
            items["eta"] = clock(seconds)
        timer = next((callback for callback in trainer.callbacks if isinstance(callback, Timer)), None)
        left = None if timer is None else timer.time_remaining()
        if left is not None:
            items["budget_left"] = clock(left)
        return items


class StepBudgetEstimate(Callback):
    """The wall time the step budget (trainer.max_steps) still needs, at the pace of this run so far.

    The pace is the wall time per step since the end of step `skip_steps` of this process (the first
    steps also start the data loaders and warm up the kernels, so they are left out); validations
    count in it once one has run. After `report_after_steps` steps it logs one line (console and
    train.log) with the pace and the estimated end, so the first lines of a run say how long it
    will take; the bar shows the estimate as `eta`."""

    def __init__(self, skip_steps: int = 5, report_after_steps: int = 20,
                 clock: Callable[[], float] = time.monotonic, now: Callable[[], datetime] = datetime.now):
        if not 0 < skip_steps < report_after_steps:
            raise ValueError(f"need 0 < skip_steps ({skip_steps}) < report_after_steps ({report_after_steps})")
        self.skip_steps, self.report_after_steps = skip_steps, report_after_steps
        self._clock, self._now = clock, now
        self._steps_run = 0                   # training steps this process has run (a resume starts at 0)
        self._origin: tuple[float, int] | None = None   # (clock, global step) after the skipped steps
        self._pace: float | None = None       # seconds per step since the origin
        self._reported = False

    def seconds_per_step(self) -> float | None:
        return self._pace

    def seconds_left(self, trainer) -> float | None:
        """Estimated seconds to max_steps; None before the pace is measured or without a step budget."""
        if self._pace is None or trainer.max_steps is None or trainer.max_steps <= 0:
            return None
        return self._pace * max(0, trainer.max_steps - trainer.global_step)

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        self._steps_run += 1
        now, step = self._clock(), trainer.global_step
        if self._steps_run == self.skip_steps:
            self._origin = (now, step)
        if self._origin is None or step <= self._origin[1]:
            return
        self._pace = (now - self._origin[0]) / (step - self._origin[1])
        if not self._reported and self._steps_run >= self.report_after_steps and trainer.is_global_zero:
            self._reported = True
            self.report(trainer)

    def report(self, trainer) -> None:
        left = self.seconds_left(trainer)
        if left is None:
            return
        end = self._now() + timedelta(seconds=left)
        first = self._origin[1] + 1
        line = (f"trainer.max_steps={trainer.max_steps}: {self._pace:.3f} s/step over steps {first}-"
                f"{trainer.global_step}, so the {trainer.max_steps - trainer.global_step} steps left take about "
                f"{clock(left)} (until about {end:%H:%M}), plus a validation per epoch and one at the end")
        bar = getattr(getattr(trainer, "progress_bar_callback", None), "train_progress_bar", None)
        if bar is not None:   # above the bar, not through it
            with bar.external_write_mode():
                log.info(line)
        else:
            log.info(line)

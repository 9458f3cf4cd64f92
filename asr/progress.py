"""The training progress bar: Lightning's, with the length of an epoch and the time budget.

Duration-bucketed batches have no length Lightning can read, so its bar shows `k/?` and no ETA.
`EpochProgressBar` gives the bar the sampler's estimate of the batches per epoch
(`EpochTaggedBucketingSampler.estimated_batches`), so tqdm shows `k/N [elapsed<remaining]` (the
validation and test bars too), and, with `trainer.max_minutes`, the wall-clock budget left (from Lightning's own Timer, which stops the
run) after the metrics: `budget_left=12:34`.
"""
from __future__ import annotations

import math

from lightning.pytorch.callbacks import Timer, TQDMProgressBar


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
    @property
    def total_train_batches(self) -> int | float:
        total = super().total_train_batches
        if not math.isinf(total):
            return total
        batches = estimated_batches(self.trainer.train_dataloader, 0)
        if math.isinf(batches):
            return batches
        max_steps = self.trainer.max_steps
        if max_steps is not None and max_steps > 0:   # the step budget may end this epoch early
            batches = min(batches, max(1, max_steps - self.trainer.global_step))
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
        timer = next((callback for callback in trainer.callbacks if isinstance(callback, Timer)), None)
        left = None if timer is None else timer.time_remaining()
        if left is not None:
            items["budget_left"] = clock(left)
        return items

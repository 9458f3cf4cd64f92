"""The Lightning callbacks asr.training.fit adds to a run besides Lightning's own (checkpoints, early
stopping), asr.training.progress's bar and asr.model.diagnostics: the batches each process ran, the time of
each epoch, every epoch's checkpoint, the checkpoints of fixed steps, a validation where the
step budget ends."""
from __future__ import annotations

import json
import time
from pathlib import Path

from lightning.pytorch.callbacks import Callback, ModelCheckpoint


class BatchRecorder(Callback):
    """trainer.record_batches=true: each process appends one JSON line per batch it runs to
    <run folder>/batches/rank<global rank>.jsonl: {"fn": fit|validate|test, "stage": train|val|test,
    "epoch", "batch", "ids": [utterance ids], "padding": stand-in batch (asr.data.batching.duration_buckets)}.
    For checking how data is split over DDP processes; off by default."""

    def __init__(self, folder: Path):
        self.folder = folder

    def _record(self, trainer, stage: str, batch: dict, batch_index: int) -> None:
        if trainer.sanity_checking:
            return
        self.folder.mkdir(parents=True, exist_ok=True)
        line = {"fn": str(trainer.state.fn.value), "stage": stage, "epoch": trainer.current_epoch,
                "batch": batch_index, "ids": list(batch["ids"]), "padding": bool(batch.get("padding"))}
        with open(self.folder / f"rank{trainer.global_rank}.jsonl", "a") as f:
            f.write(json.dumps(line) + "\n")

    def on_train_batch_start(self, trainer, module, batch, batch_index) -> None:
        self._record(trainer, "train", batch, batch_index)

    def on_validation_batch_start(self, trainer, module, batch, batch_index, dataloader_index=0) -> None:
        self._record(trainer, "val", batch, batch_index)

    def on_test_batch_start(self, trainer, module, batch, batch_index, dataloader_index=0) -> None:
        self._record(trainer, "test", batch, batch_index)


class EpochTimer(Callback):
    """Wall-clock seconds of each training epoch, with and without its validation."""

    def __init__(self):
        self.epochs: list[dict[str, float]] = []
        self._start = self._validation_start = None

    def on_train_epoch_start(self, trainer, module) -> None:
        self._start, self._validation_start = time.perf_counter(), None

    def on_validation_start(self, trainer, module) -> None:
        if self._start is not None and not trainer.sanity_checking and self._validation_start is None:
            self._validation_start = time.perf_counter()

    def on_train_epoch_end(self, trainer, module) -> None:
        if self._start is None:   # a resume that restarts at the end of its checkpoint's epoch (with max_steps)
            return
        end = time.perf_counter()
        self.epochs.append({"epoch": trainer.current_epoch,
                            "train_seconds": (self._validation_start or end) - self._start,
                            "seconds": end - self._start})


class EpochCheckpoint(ModelCheckpoint):
    """Keeps every epoch's checkpoint; its own class so Lightning keeps its state apart from `latest`'s."""


class StepCheckpoint(ModelCheckpoint):
    """trainer.keep_checkpoints_every_n_steps=N: keeps checkpoints/step-NNNNNN.ckpt after every N-th
    optimiser step (global step N, 2N, ...; the number is the steps done). The schedule is the
    global step's, so a run resumed with ckpt_path=last goes on with it."""

    def __init__(self, dirpath, every_n_steps: int):
        super().__init__(dirpath=dirpath, filename="step-{step:06d}", every_n_train_steps=every_n_steps,
                         save_top_k=-1, auto_insert_metric_name=False, enable_version_counter=False)


class LatestStepCheckpoint(ModelCheckpoint):
    """trainer.checkpoint_every_n_steps=N: rewrites checkpoints/last.ckpt after every N-th optimiser
    step (the epoch-end `latest` checkpoint still rewrites it at each epoch's end). Its own class so
    Lightning keeps its state apart from the other checkpoints'."""

    def __init__(self, dirpath, every_n_steps: int):
        super().__init__(dirpath=dirpath, filename="last", every_n_train_steps=every_n_steps, save_top_k=1,
                         enable_version_counter=False)

    def on_train_batch_end(self, trainer, module, outputs, batch, batch_index) -> None:
        # Not at an epoch's last batch: the epoch's end has its own checkpoint (`latest`, after the
        # validation). Resuming from one written here takes Lightning's (2.6) restart at an epoch's
        # last batch, which skips that epoch's validation and carries the epoch's batch count into
        # the next epoch: the stream position saved there (asr.data.datamodule.state_dict) then counts
        # the previous epoch's batches too, and a second resume skips as many (tests/asr/test_faults_streaming.py).
        if trainer.fit_loop.epoch_loop.batch_progress.is_last_batch:
            return
        super().on_train_batch_end(trainer, module, outputs, batch, batch_index)


class ValidateAtStepBudget(Callback):
    """Validates when trainer.max_steps is reached inside an epoch, so the steps after the last
    epoch's end count: Lightning (2.6) ends fit there without validating, so those steps never
    reached best.ckpt (which the test line scores) and last.ckpt carried the previous epoch's
    validation rates. Asking the trainer to stop at that step makes Lightning validate first, as it
    does when trainer.max_minutes runs out (its Timer stops the same way); the checkpoints are then
    written as at any epoch's end. An epoch that ends at the budget validates once, as before.
    With check_val_every_n_epoch > 1, an epoch that does not validate still does not."""

    def on_train_batch_end(self, trainer, module, outputs, batch, batch_index) -> None:
        if trainer.max_steps is not None and 0 < trainer.max_steps <= trainer.global_step:
            trainer.should_stop = True

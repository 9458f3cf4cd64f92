"""The Lightning callbacks asr.training.fit adds to a run besides Lightning's own (checkpoints, early
stopping), asr.training.progress's bar and asr.model.diagnostics: the batches each process ran, the time of
each epoch, every epoch's checkpoint, the checkpoints of fixed steps, a validation where the
step budget ends, a line in train.log per validation, and early stopping on a relative gain."""
from __future__ import annotations

import json
import logging
import math
import time
from pathlib import Path

from lightning.pytorch.callbacks import Callback, ModelCheckpoint

log = logging.getLogger("asr.train")


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


class ValidationLog(Callback):
    """One line in train.log (logger asr.train) after each validation of a training: the step, the dev
    error rates and losses, the best primary error so far and its step, the lr of the plateau
    schedule (the optimiser's, before any warm-up scaling), and the hours the run has trained in all
    its sittings so far (wall time from each sitting's start of training, validations included). A run
    trained over days is followed with `grep validation RUN/train.log` (each sitting appends to it).
    The best and the hours are kept in the checkpoints, so a resumed run's lines go on from them (a
    checkpoint written before the hours were kept counts from the sitting that resumes it)."""

    def __init__(self):
        self.best: tuple[float, int] | None = None    # (primary error, global step)
        self.earlier_seconds = 0.0      # trained in the sittings before this one (from the checkpoint)
        self.earlier_sittings = 0
        self._sitting_started: float | None = None

    def line(self, step: int, metrics: dict[str, float], lr: float, trained_seconds: float | None = None,
             sittings: int = 1) -> str:
        """The line for one validation (metrics: the val/ metrics without the prefix); updates the best."""
        primary = metrics["primary_error"]
        if not math.isnan(primary) and (self.best is None or primary < self.best[0]):
            self.best = (primary, step)
        rates = [f"{name.upper()} {100 * metrics[name]:.2f} %" for name in ("per", "wer", "cer") if name in metrics]
        losses = [f"{name} {value:.4g}" for name, value in sorted(metrics.items()) if name.startswith("loss")]
        best = "none yet" if self.best is None else f"{100 * self.best[0]:.2f} % at step {self.best[1]}"
        parts = [", ".join(rates), ", ".join(losses), f"best primary error {best}", f"lr {lr:.3g}"]
        if trained_seconds is not None:
            parts.append(f"trained {trained_seconds / 3600:.2f} h in {sittings} sitting{'s' if sittings > 1 else ''}")
        return f"validation at step {step}: " + "; ".join(part for part in parts if part)

    def trained_seconds(self) -> float:
        """The run's training time so far: the earlier sittings' and this one's."""
        now = 0.0 if self._sitting_started is None else time.monotonic() - self._sitting_started
        return self.earlier_seconds + now

    def on_train_start(self, trainer, module) -> None:
        self._sitting_started = time.monotonic()

    def on_validation_end(self, trainer, module) -> None:
        if trainer.sanity_checking or trainer.state.fn != "fit":
            return
        metrics = {name[len("val/"):]: float(value) for name, value in trainer.callback_metrics.items()
                   if name.startswith("val/")}
        if "primary_error" not in metrics:
            return
        line = self.line(trainer.global_step, metrics, trainer.optimizers[0].param_groups[0]["lr"],
                         self.trained_seconds(), self.earlier_sittings + 1)
        if trainer.is_global_zero:
            log.info(line)

    def state_dict(self) -> dict:
        return {"best": self.best, "trained_seconds": self.trained_seconds(), "sittings": self.earlier_sittings + 1}

    def load_state_dict(self, state_dict: dict) -> None:
        best = state_dict.get("best")
        self.best = None if best is None else (float(best[0]), int(best[1]))
        self.earlier_seconds = float(state_dict.get("trained_seconds", 0.0))
        self.earlier_sittings = int(state_dict.get("sittings", 0))


class RelativePlateauStop(Callback):
    """trainer.early_stopping_patience=P with trainer.early_stopping_min_relative_gain=G: stops training
    when P validations in a row have each left `monitor` (the primary error rate) at or above
    reference x (1 - G). The reference is the value of the last validation that did gain that much
    (the first validation's value to begin with); a smaller decrease does not move it, so several small
    decreases add up until together they make the gain. G=0.02 and P=3: "no 2 % relative gain over 3
    validations". Lightning's EarlyStopping measures its min_delta in absolute units, which would mean
    another threshold at 50 % PER than at 5 %.

    With start_below=S (trainer.early_stopping_start_below), validations at or above S count for
    nothing until the first one below S, which is the first reference: a CTC model still emitting
    only blanks (PER ~99 %) can stay there for thousands of steps before it begins, and that flat
    stretch is not the plateau the rule is for.

    The count is in the checkpoints (state_dict), so a resumed run goes on counting where it stopped.
    """

    def __init__(self, monitor: str, patience: int, min_relative_gain: float, start_below: float | None = None):
        self.monitor, self.patience, self.min_relative_gain = monitor, patience, min_relative_gain
        self.start_below = start_below
        self.reference: float | None = None     # the value of the last validation with the gain
        self.wait = 0                           # validations since then
        self.stopped_step: int | None = None    # the global step training stopped at

    def gains(self, value: float) -> bool:
        """Whether `value` is the gain the rule asks for (a NaN never is)."""
        return self.reference is None or value < self.reference * (1.0 - self.min_relative_gain)

    def observe(self, value: float) -> bool:
        """Counts one validation's value; True when training should stop."""
        if self.reference is None and self.start_below is not None and not value < self.start_below:
            return False                        # not begun (NaN included): nothing to count yet
        if not math.isnan(value) and self.gains(value):
            self.reference, self.wait = value, 0
        else:
            self.wait += 1
        return self.wait >= self.patience

    def standing(self) -> str:
        """Where the count stands, in words (logged after each validation that does not stop training)."""
        if self.reference is None:
            begun = "" if self.start_below is None else f" (counting starts below {self.start_below:.4g})"
            return f"not begun{begun}"
        target = self.reference * (1.0 - self.min_relative_gain)
        return (f"{self.wait} of {self.patience} validations without {self.monitor} below {target:.4g} "
                f"({100 * self.min_relative_gain:g} % under {self.reference:.4g})")

    def on_validation_end(self, trainer, module) -> None:
        if trainer.sanity_checking or trainer.state.fn != "fit" or self.monitor not in trainer.callback_metrics:
            return
        value = float(trainer.callback_metrics[self.monitor])
        stop = trainer.strategy.reduce_boolean_decision(self.observe(value), all=False)
        if not stop and trainer.is_global_zero:
            log.info("plateau rule at step %d: %s", trainer.global_step, self.standing())
        if stop:
            trainer.should_stop = True
            self.stopped_step = trainer.global_step
            log.info("early stopping at step %d: %d validations without %s below %.4g (%g %% under %.4g, the last "
                     "validation that gained that much)", trainer.global_step, self.wait, self.monitor,
                     self.reference * (1.0 - self.min_relative_gain), 100 * self.min_relative_gain, self.reference)

    def state_dict(self) -> dict:
        return {"reference": self.reference, "wait": self.wait, "stopped_step": self.stopped_step}

    def load_state_dict(self, state_dict: dict) -> None:
        self.reference, self.wait = state_dict["reference"], state_dict["wait"]
        self.stopped_step = state_dict["stopped_step"]

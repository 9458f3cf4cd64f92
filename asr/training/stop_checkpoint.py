"""A checkpoint when training is stopped by SIGTERM: `docker stop` (through the image's tini), a
cluster's preemption, `kill`. Lightning turns SIGTERM into SIGTERMException after the batch that
is running, at a step boundary; without this callback the run would keep only its last epoch's
checkpoint, or none in its first epoch (the synth preset's epochs are ~400 steps)."""
from __future__ import annotations

import logging
from pathlib import Path

from lightning.pytorch.callbacks import Callback
from lightning.pytorch.trainer.states import TrainerFn
from lightning.pytorch.utilities.exceptions import SIGTERMException

log = logging.getLogger(__name__)


class CheckpointOnSigterm(Callback):
    """Writes <checkpoints>/last.ckpt (the file `ckpt_path=last` resumes from; the end of the next
    epoch rewrites it) when fit is stopped by SIGTERM. Every process calls it: saving is collective
    in a multi-process run, and the SIGTERM reached them all (Lightning broadcasts it)."""

    def __init__(self, folder: Path):
        self.path = Path(folder) / "last.ckpt"

    def on_exception(self, trainer, pl_module, exception: BaseException) -> None:
        if not isinstance(exception, SIGTERMException) or trainer.state.fn != TrainerFn.FITTING \
                or trainer.sanity_checking:
            return
        trainer.save_checkpoint(self.path)
        log.info("SIGTERM: saved %s at step %d; resume with ckpt_path=last", self.path, trainer.global_step)

"""The one place where the commands silence what libraries print that a user cannot act on.

Each filter matches one message (from one module, or of one Lightning warning category), so every
other warning still shows; each says why it is safe to drop. Every command (asr.train, asr.evaluate, asr.cross_matrix) calls
install_warning_filters() when it starts; calling it again changes nothing.
"""
from __future__ import annotations

import logging
import warnings

from lightning.pytorch.utilities.warnings import PossibleUserWarning

# Lightning logs its tips through whichever of these its rank-zero helpers were last bound to.
_LIGHTNING_INFO_LOGGERS = ("lightning.pytorch.utilities.rank_zero", "lightning.fabric.utilities.rank_zero")


# Lightning's info lines that say again what asr.train's own lines say, or nothing on any machine:
_REPEATED_OR_EMPTY = (
    "💡 Tip: For seamless cloud",      # its cloud services (litlogger, litmodels), at the start of every run
    "`Trainer.fit` stopped: ",          # asr.train's "training stopped: ..." names the budget that ended it
    "Restoring states from the checkpoint path at ",   # asr.train says which checkpoint it resumes or tests
    "Restored all states from the checkpoint at ",
    "Loaded model weights from the checkpoint at ",
    "TPU available: False",             # a TPU-less machine (a TPU that is there is still said)
)


def _is_worth_showing(record: logging.LogRecord) -> bool:
    return not record.getMessage().startswith(_REPEATED_OR_EMPTY)


def install_warning_filters() -> None:
    # torch 2.13 deprecated LeafSpec, and Lightning 2.6's own copy of tree_flatten still builds one
    # in every fit and test; nothing in this project or its config can change that (a Lightning
    # release will).
    warnings.filterwarnings("ignore", message=r"`isinstance\(treespec, LeafSpec\)` is deprecated",
                            category=FutureWarning, module=r"lightning\.pytorch\.utilities\._pytree")
    # The recognizer logs error rates and losses gathered from every process (the same values on
    # each), so Lightning's advice to synchronise epoch-level logs under DDP does not apply.
    warnings.filterwarnings("ignore", message=r".*sync_dist=True.* when logging on epoch level",
                            category=PossibleUserWarning)
    # A resumed run writes into its own checkpoints/ on purpose, and asr.train refuses to start a
    # fresh run in a folder that holds checkpoints, so this warning never points at a mistake.
    warnings.filterwarnings("ignore", message=r"Checkpoint directory .* exists and is not empty",
                            module=r"lightning\.pytorch\.callbacks\.model_checkpoint")
    for name in _LIGHTNING_INFO_LOGGERS:
        logger = logging.getLogger(name)
        if _is_worth_showing not in logger.filters:
            logger.addFilter(_is_worth_showing)

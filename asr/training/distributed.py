"""What asr.train adds to Lightning's DDP for runs of several processes, on one machine or many.

- `launched_rank`: the global rank an outside launcher (torchrun, srun) gave this process; asr.train
  gives the processes other than rank 0 a log file of their own, `train_ddp_process_<rank>.log`, as
  Lightning's own launcher does for the processes it starts.
- `check_launch_matches_trainer`: `trainer.devices` x `trainer.num_nodes` must be the processes the
  launcher started; said at start-up, before the data is prepared, instead of by Lightning inside fit.
- `apply_collective_timeout`: `trainer.ddp_timeout_minutes` becomes the process group's timeout;
  `CollectiveTimeoutLine` logs it when fit starts, as the process group has it.
- `lost_process`: whether an exception says that another process of the run has gone (killed, out
  of memory, its machine lost) or stopped answering, so that asr.train can say so in one line with
  the command that resumes the run, instead of a traceback from inside a collective.

What happens when a process of a run dies (measured on the CPU with gloo, tests/asr/test_ddp_nodes.py):
the others notice at their next collective (the gradient averaging of every step, the gathering of
validation transcripts): its sockets are closed, so gloo fails at once ("Connection reset by peer",
"Connection closed by peer"). A process that hangs, or a machine that is lost without closing its
connections, is noticed only when the collective's timeout runs out (`trainer.ddp_timeout_minutes`).
Each launcher then ends the rest: torchrun's agent stops the other processes of its machine as soon
as one has failed; Lightning's own launcher (trainer.devices=N, one command) kills all processes
within 5 s of a failed one; srun ends the step when a task fails with --kill-on-bad-exit=1 (without
it, the remaining tasks still stop at their next collective). With NCCL (GPUs), torch's watchdog
aborts a process whose collective passed the timeout.
"""
from __future__ import annotations

import logging
import os
import re
from datetime import timedelta
from typing import Any

import torch
from lightning.pytorch.callbacks import Callback

from asr.core.errors import ConfigError

log = logging.getLogger("asr.train")


def launched_rank() -> int | None:
    """This process's global rank when an outside launcher started it together with others
    (torchrun: RANK under TORCHELASTIC_RUN_ID; srun: SLURM_PROCID of a step of several tasks);
    None for a single process and for the processes Lightning's own launcher starts (those get
    LOCAL_RANK only, and Lightning names their logs itself)."""
    if os.environ.get("TORCHELASTIC_RUN_ID") is not None and int(os.environ.get("WORLD_SIZE", "1")) > 1:
        return int(os.environ.get("RANK", "0"))
    if int(os.environ.get("SLURM_STEP_NUM_TASKS", "1")) > 1 and os.environ.get("SLURM_PROCID") is not None:
        return int(os.environ["SLURM_PROCID"])
    return None


def _devices_per_node(devices: Any) -> int | None:
    """trainer.devices as a count, or None where only Lightning can tell (auto, -1: all GPUs)."""
    if isinstance(devices, (list, tuple)) or (hasattr(devices, "__len__") and not isinstance(devices, str)):
        return len(devices)
    try:
        count = int(devices)
    except (TypeError, ValueError):
        return None
    return count if count > 0 else None


def check_launch_matches_trainer(trainer: Any) -> None:
    """ConfigError when trainer.devices x trainer.num_nodes cannot be the processes that torchrun or
    srun started (Lightning would stop inside fit, after the data was prepared, with a traceback)."""
    devices = _devices_per_node(trainer.devices)
    nodes = int(trainer.num_nodes)
    if os.environ.get("TORCHELASTIC_RUN_ID") is not None and "WORLD_SIZE" in os.environ:
        world_size = int(os.environ["WORLD_SIZE"])
        if devices is not None and devices * nodes != world_size:
            raise ConfigError(
                f"trainer.devices={trainer.devices} x trainer.num_nodes={nodes} = {devices * nodes} processes, but "
                f"torchrun started {world_size}; give trainer.devices=<its --nproc-per-node> and "
                f"trainer.num_nodes=<its --nnodes>")
    elif int(os.environ.get("SLURM_STEP_NUM_TASKS", "1")) > 1:
        per_node = os.environ.get("SLURM_NTASKS_PER_NODE", "").split("(")[0]   # e.g. "4(x2)"
        if devices is not None and per_node.isdigit() and int(per_node) != devices:
            raise ConfigError(f"trainer.devices={trainer.devices} is not allowed: srun starts {per_node} tasks per "
                              f"node (--ntasks-per-node); give trainer.devices={per_node}")
        machines = os.environ.get("SLURM_NNODES")
        if machines is not None and machines.isdigit() and int(machines) != nodes:
            raise ConfigError(f"trainer.num_nodes={nodes} is not allowed: the job has {machines} nodes (--nodes); "
                              f"give trainer.num_nodes={machines}")


def apply_collective_timeout(trainer, minutes: float) -> None:
    """Makes `minutes` the timeout of the process group a DDP trainer creates when fit starts (the
    wait at start-up for the other processes, and at every collective). Lightning takes a timeout
    only as DDPStrategy's constructor argument, which the strategy names (ddp, auto) do not reach,
    so it is set on the strategy the Trainer chose; Lightning (2.6) reads it when it initialises the
    process group (DDPStrategy._setup_distributed). tests/asr/test_ddp_nodes.py checks that it arrives."""
    from lightning.pytorch.strategies import DDPStrategy

    if isinstance(trainer.strategy, DDPStrategy):
        trainer.strategy._timeout = timedelta(minutes=minutes)


def collective_timeout() -> timedelta | None:
    """The timeout of this process's default process group (None when there is none, or this torch
    does not say)."""
    if not (torch.distributed.is_available() and torch.distributed.is_initialized()):
        return None
    try:
        group = torch.distributed.group.WORLD
        backend = group._get_backend(torch.device("cuda" if torch.distributed.get_backend() == "nccl" else "cpu"))
        return backend.options._timeout
    except (AttributeError, RuntimeError):
        return None


class CollectiveTimeoutLine(Callback):
    """One log line when a multi-process fit starts: how many processes, and how long each waits at a
    collective for the others (read back from the process group torch made)."""

    def setup(self, trainer, module, stage: str) -> None:
        if stage != "fit" or trainer.world_size < 2 or not trainer.is_global_zero:
            return
        timeout = collective_timeout()
        waits = "" if timeout is None else (f"; a process waits at most {timeout.total_seconds() / 60:g} min at a "
                                            "collective for the others (trainer.ddp_timeout_minutes)")
        log.info("DDP: %d processes, %d machine(s) x %d%s", trainer.world_size, trainer.num_nodes,
                 trainer.num_devices, waits)


# What a collective raises when a peer is gone: gloo's transport errors (a closed or reset connection,
# a timeout), and torch.distributed's DistError family (NCCL's errors among them).
_LOST_PEER = re.compile(r"connection (?:closed|reset) by peer|broken pipe|timed out|timeout|pair closure", re.I)


def lost_process(error: BaseException) -> str | None:
    """What happened, when `error` is a collective's failure because another process is gone or does
    not answer (in our words, then the library's); None otherwise."""
    distributed = getattr(torch.distributed, "DistError", ())
    text = str(error)
    if not (isinstance(error, distributed) or ("gloo" in text.lower() and _LOST_PEER.search(text))):
        return None
    detail = text.splitlines()[0] if text else type(error).__name__
    detail = re.sub(r"^\[[^\]]*\]\s*", "", detail)      # gloo prefixes its source file and line
    detail = detail.split(". ")[0].rstrip(".")[:160]     # and explains at length after the first sentence
    if re.search(r"timed out|timeout", text, re.I):
        return (f"another process of the run did not answer within trainer.ddp_timeout_minutes: it hangs, or its "
                f"machine is unreachable ({detail})")
    return f"another process of the run has ended: killed, out of memory, or its machine lost ({detail})"

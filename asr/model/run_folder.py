"""Run folders: where a training run lives, how a resumed or multi-process run finds it, the lock
that keeps it to one run at a time, the lock its processes prepare data under, and what evaluation
reads back from it.

    <run_root>/<preset>/<timestamp>/   (or run_dir=...; the layout: asr/train.py's docstring)
        config.yaml                    the resolved config (`stored_data_config` reads its data section)
        checkpoints/*.ckpt             (`run_folder_of` goes from one back to its folder)
"""
from __future__ import annotations

import fcntl
import logging
import os
import shutil
from contextlib import contextmanager
from datetime import datetime
from pathlib import Path

import yaml

from asr.core.errors import ConfigError
from asr.core.file_locks import try_lock, write_holder
from asr.model.checkpoint import CheckpointError, newest_usable_checkpoint, read_checkpoint

log = logging.getLogger("asr.train")


def run_folder(run_root: str, preset: str | None, run_dir: str | None, ckpt_path: str | None) -> str:
    """Hydra's run directory: run_dir if given; with ckpt_path=last the newest earlier run of
    this preset that has checkpoints/last.ckpt (so a resumed run continues in its own folder);
    otherwise a new <run_root>/<preset>/<timestamp>.

    Processes started together by an outside launcher each compute this folder, and a timestamp
    could differ between them, so they get a name they all share: `slurm-<job id>-<step id>` for
    the tasks of one srun step, `torchrun-<rendezvous id>` under torchrun with a rendezvous id (--standalone
    or --rdzv-id). torchrun without one must be given run_dir (train() says so).
    """
    if run_dir not in (None, "", "None", "null"):
        return str(run_dir)
    folder = Path(run_root) / (preset or "custom")
    if ckpt_path == "last":
        earlier = sorted(folder.glob("*/checkpoints/last.ckpt"), key=lambda p: p.stat().st_mtime)
        if earlier:
            return str(earlier[-1].parent.parent)
    return str(folder / (shared_launch_name() or datetime.now().strftime("%Y-%m-%d_%H-%M-%S")))


def shared_launch_name() -> str | None:
    """A run folder name shared by all processes of an outside launcher, or None (see run_folder)."""
    # the tasks of one srun step (another srun in the same job gets another folder)
    if int(os.environ.get("SLURM_STEP_NUM_TASKS", "1")) > 1 and os.environ.get("SLURM_JOB_ID"):
        return f"slurm-{os.environ['SLURM_JOB_ID']}-{os.environ.get('SLURM_STEP_ID', '0')}"
    if int(os.environ.get("WORLD_SIZE", "1")) > 1 and os.environ.get("TORCHELASTIC_RUN_ID", "none") != "none":
        return f"torchrun-{os.environ['TORCHELASTIC_RUN_ID']}"
    return None


def check_launch_shares_run_folder(run_dir_option: str | None) -> None:
    """torchrun with its default static rendezvous has no id the processes share; each would then
    write into a folder of its own, so an explicit run_dir is required."""
    if (run_dir_option in (None, "", "None", "null") and int(os.environ.get("WORLD_SIZE", "1")) > 1
            and os.environ.get("TORCHELASTIC_RUN_ID") == "none"):
        raise ConfigError(
            f"torchrun started {os.environ['WORLD_SIZE']} processes without a rendezvous id, so they cannot agree "
            "on a run folder; give each the same run_dir=FOLDER (or start torchrun with --rdzv-id=ID or --standalone)")


def resolve_checkpoint(ckpt_path: str | None, run_dir: Path) -> tuple[Path | None, dict | None]:
    """(the checkpoint to resume from, its contents), or (None, None) for a fresh run; a clear error
    if it is not there. A fresh run never starts in a folder that already holds checkpoints (it
    would overwrite them).

    ckpt_path=last resumes from the newest checkpoint of run_dir that can be read: last.ckpt, or
    when that is damaged an older one (best.ckpt), saying so. A run killed before its first
    checkpoint (the folder has its config.yaml, no checkpoint) starts again from the beginning."""
    checkpoints = run_dir / "checkpoints"
    if ckpt_path in (None, ""):
        if any(checkpoints.glob("*.ckpt")):
            raise ConfigError(f"run folder {run_dir} already holds checkpoints of an earlier run; resume it with "
                              f"ckpt_path=last, or give another run_dir")
        return None, None
    if ckpt_path == "last":
        found = newest_usable_checkpoint(checkpoints) if checkpoints.is_dir() else None
        if found is None:
            if (run_dir / "config.yaml").is_file():
                log.warning("ckpt_path=last: run folder %s has no checkpoint yet (the run stopped before its "
                            "first one); starting it from the beginning", run_dir)
                return None, None
            raise ConfigError(
                f"ckpt_path=last: no earlier run with checkpoints/last.ckpt under {run_dir.parent}; "
                "start a fresh run (no ckpt_path), or give run_dir=FOLDER or ckpt_path=FILE.ckpt")
        path, checkpoint, passed_over = found
        for problem in passed_over:
            log.warning("ckpt_path=last: passing over %s", problem)
        if passed_over:
            log.warning("ckpt_path=last: resuming from %s, the newest checkpoint that can be used", path)
        for stray in checkpoints.glob(".*.tmp"):   # what a write killed before its rename left (AtomicCheckpointIO)
            stray.unlink(missing_ok=True)
        return path, checkpoint
    path = Path(ckpt_path)
    if not path.exists():
        raise ConfigError(f"ckpt_path={ckpt_path!r}: no such checkpoint file; give a .ckpt file or 'last'")
    return path, read_checkpoint(path)


RUN_LOCK = ".run.lock"
_claimed_run_folders: dict[Path, object] = {}   # resolved folder -> the open lock file, held until exit


class RunFolderInUseError(ConfigError):
    """Another run holds the run folder (a usage error that must not remove the folder: it is not ours)."""


def claim_run_folder(run_dir: Path) -> None:
    """Makes this process the run folder's one owner until it exits, or refuses at once when another
    run holds it: two runs writing one folder would mix their checkpoints and results. An flock on
    RUN_LOCK, whose text names the holder (pid, host, start time) for the error message; the kernel
    releases it when the holder dies in any way, so a stale file from a killed run is simply taken
    over. Only the first process of a multi-process launch claims (the others share its folder)."""
    key = run_dir.resolve()
    if key in _claimed_run_folders:   # this process already owns it (a second train() in one process)
        return
    run_dir.mkdir(parents=True, exist_ok=True)
    handle = open(run_dir / RUN_LOCK, "a+")
    try:
        holder = try_lock(handle)
    except OSError as error:   # e.g. Lustre mounted without flock: ENOSYS
        handle.close()
        raise ConfigError(
            f"the run folder {run_dir} is on a file system without file locks (flock: {error.strerror}), which "
            "keep it to one run at a time; give run_dir= on a file system with them (Lustre: -o flock)") from None
    if holder is not None:
        handle.close()
        raise RunFolderInUseError(
            f"run folder {run_dir} is in use by another run ({holder}); wait for it to end, or give another "
            "run_dir")
    write_holder(handle)
    _claimed_run_folders[key] = handle


@contextmanager
def one_process_at_a_time(lock_file: Path):
    """Processes of one run that an outside launcher starts together (torchrun, srun) write what the
    data preparation writes - the synth corpus, the feature cache and statistics, the run's copies of
    the lexicon and LM - one after another: the first does the work, the others find it on disk (the
    caches' writes are not safe against concurrent writers). Reading needs no lock, so they load and
    check the manifests all at once (asr.training.fit.train). Lightning's own launcher starts the other
    processes only after this one has prepared the data.

    An flock on a file in the run folder: it holds between the processes of one machine on any file
    system; between machines only where the file system makes flock locks cluster-wide (NFS does on
    Linux clients; Lustre with the `flock` mount option, not `localflock`): asr/docs/training.md,
    "Several GPUs and machines"."""
    lock_file.parent.mkdir(parents=True, exist_ok=True)
    with open(lock_file, "a") as handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX)
        except OSError as error:   # e.g. Lustre mounted without flock: ENOSYS
            raise ConfigError(
                f"the run folder {lock_file.parent} is on a file system without file locks (flock: "
                f"{error.strerror}), which the processes of a run need to prepare data one at a time; give "
                "run_dir= on a file system with them (Lustre: mounted with -o flock)") from None
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


# What a run folder holds before the run has produced anything: Hydra's record (.hydra/), the log,
# the resolved config, the run and data-preparation locks and the copies of the corpus's lexicon and LM.
BOOKKEEPING = {".hydra", "train.log", "config.yaml", RUN_LOCK, ".data_preparation.lock", "decoding"}


def remove_unused_run_folder(run_dir: Path, run_dir_option: str | None) -> None:
    """Removes the run folder Hydra made for a run that stopped on a usage error, and its preset
    folder if that is left empty. A folder holding anything but BOOKKEEPING (checkpoints, logs,
    results) stays, and so does a folder shared by the processes of an outside launcher."""
    if int(os.environ.get("WORLD_SIZE", "1")) > 1 or not run_dir.is_dir():
        return
    if any(entry.name not in BOOKKEEPING for entry in run_dir.iterdir()):
        return
    shutil.rmtree(run_dir, ignore_errors=True)
    if run_dir_option in (None, "", "None", "null"):   # <run_root>/<preset>/<timestamp>: ours too
        try:
            run_dir.parent.rmdir()   # only if empty
        except OSError:
            pass


def run_folder_of(checkpoint: str | Path) -> Path | None:
    """The run folder of an asr.train checkpoint (<run>/checkpoints/x.ckpt), if it has config.yaml."""
    run = Path(checkpoint).resolve().parent.parent
    return run if (run / "config.yaml").is_file() else None


def stored_data_config(run: Path) -> dict:
    """The data section of a run folder's config.yaml (as asr.train stored it, data.root as given);
    CheckpointError naming the file when it is not YAML, not UTF-8, or its data section not a mapping."""
    path = run / "config.yaml"
    try:
        stored = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
    except (yaml.YAMLError, UnicodeDecodeError) as error:
        where = getattr(error, "problem_mark", None)
        line = f" (line {where.line + 1})" if where is not None else ""
        raise CheckpointError(f"{path}{line} is not a readable config ({str(error).splitlines()[0]}); it is the "
                              "config asr.train wrote beside the checkpoint: restore it, or move the checkpoint "
                              "out of its run folder and give its data with data.* options") from None
    data = stored.get("data") if isinstance(stored, dict) else None
    if not isinstance(stored, dict) or not isinstance(data or {}, dict):
        raise CheckpointError(f"{path} does not hold a config with a data: section as asr.train writes it; restore "
                              "it, or move the checkpoint out of its run folder and give its data with data.* options")
    return dict(data or {})


def trained_data_config(checkpoint: str | Path) -> dict:
    """The data section the checkpoint was trained with (from its run folder), or {} if unknown."""
    run = run_folder_of(checkpoint)
    return {} if run is None else stored_data_config(run)

"""Train a CTC transformer: `python -m asr.train [conf=PRESET] [overrides ...]`.

    python -m asr.train                                    # preset synth_iclustered, built-in corpus
    python -m asr.train conf=synth_full trainer.max_epochs=5
    python -m asr.train conf=synth_full ckpt_path=last     # resume the newest synth_full run
    python -m asr.train conf=wsj_iclustered data.root=data/wsj   # a corpus prepared by recipes/wsj

One run = one folder (<run_root>/<preset>/<timestamp>, or run_dir=...):
    config.yaml             the resolved config (.hydra/ holds Hydra's own record and the overrides)
    checkpoints/best.ckpt   lowest validation error of the primary target; checkpoints/last.ckpt
    logs/version_N/         TensorBoard events and metrics.csv (one version per start or resume)
    results.json            test and best-validation PER/WER/CER, time per epoch, parameters, ...
    train.log               what the console showed but the progress bars, through the test result
                            and why training stopped (train_ddp_process_N.log: the other processes
                            of a multi-device run that Lightning started itself)
    batches/rankN.jsonl     with trainer.record_batches=true: the utterance ids of every batch
                            process N ran (BatchRecorder)
    decoding/               the corpus's lexicon.txt and lm/3gram.arpa.gz, when it has them: what
                            decoder=lexicon uses for this model from any folder (asr.decoding.evaluation)

Several devices or machines (trainer.devices, trainer.num_nodes; Lightning's DDP): every process
runs this module; the data module gives each its share of every split, the recognizer gathers
validation and test transcripts from all of them, and process 0 writes results.json. Processes
started together by an outside launcher (torchrun, srun) prepare the data one at a time and must
share one run folder (see run_folder).

The flow, top to bottom: check the config -> make the corpus if it is the built-in one and
missing -> data module (tokenizers, feature stats) -> model -> Lightning fit -> test the best
checkpoint -> results.json.
"""
from __future__ import annotations

import fcntl
import json
import logging
import os
import shlex
import shutil
import sys
import tempfile
import time
from contextlib import contextmanager
from datetime import datetime
from pathlib import Path

import hydra
import lightning as L
import torch
from hydra.core.hydra_config import HydraConfig
from lightning.pytorch.callbacks import Callback, EarlyStopping, ModelCheckpoint, Timer
from lightning.pytorch.loggers import CSVLogger, TensorBoardLogger
from lightning.pytorch.plugins.io import TorchCheckpointIO
from lightning.pytorch.utilities.rank_zero import rank_zero_only
from omegaconf import DictConfig, OmegaConf

from asr.config import ConfigError, register_schema, validate_config
from asr.config_help import schema_help
from asr.config_spelling import exit_on_misspelt_override
from asr.data.corpus_preparers import corpus_preparer, unregistered_note
from asr.data.datamodule import SpeechDataModule
from asr.data.manifests import ManifestError, preparation_hint
from asr.decoding.evaluation import keep_decoding_files_in_run
from asr.fault_injection import pause_point
from asr.exit_status import FAILURE, INTERRUPTED, USAGE_ERROR
from asr.metrics import percent
from asr.model.checkpoint import CheckpointError, newest_usable_checkpoint, read_checkpoint
from asr.model.diagnostics import TrainingDiagnostics
from asr.model.encoder import compile_encoder
from asr.model.recognizer import CheckpointMismatchError, SpeechRecognizer, check_state_dict_fits
from asr.progress import EpochProgressBar, StepBudgetEstimate
from asr.warning_filters import install_warning_filters
from attention_ext import AttentionConfigError

log = logging.getLogger("asr.train")
# train.log only (train_log_keeps_the_console): what the console gets by print, Lightning's table and
# a failure's traceback, which the console has in their own form.
file_log = logging.getLogger("asr.train.file")
file_log.propagate = False
SPLITS = ("train_split", "dev_split", "test_split")


# ---- the run folder ------------------------------------------------------------------------------
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


# use_cache: Hydra may resolve hydra.run.dir more than once; the timestamp must not change.
OmegaConf.register_new_resolver("asr_run_dir", run_folder, use_cache=True, replace=True)
# --help's key table (conf/config.yaml, hydra.help.template), from the schema's comments
OmegaConf.register_new_resolver("asr_schema_help", schema_help, replace=True)
register_schema()


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


# ---- the corpus ----------------------------------------------------------------------------------
def ensure_corpus(cfg: DictConfig) -> None:
    """Generates a corpus whose manifests are missing when a preparer is registered for it
    (asr.data.corpus_preparers: the built-in synthetic corpus); for any other corpus (the user's copy
    of WSJ, TIMIT, ...) missing manifests are a ConfigError naming the recipe command."""
    data = cfg.data
    root = Path(data.root)
    missing = [split for split in (data.train_split, data.dev_split, data.test_split)
               if not (root / f"{data.corpus}_cuts_{split}.jsonl.gz").is_file()]
    if not missing:
        return
    preparer = corpus_preparer(data.corpus)
    if preparer is None:   # a real corpus is the user's: say how to prepare it, never guess
        where = (f"data.root={str(root)!r} does not exist, so it holds no {data.corpus} manifests"
                 if not root.is_dir() else
                 f"data.root={str(root)!r} has no {data.corpus}_cuts_<split>.jsonl.gz for split(s) {missing}")
        raise ConfigError(f"{where}; {preparation_hint(data.corpus, root)}, then run again with "
                          f"data.root=<that folder> ({unregistered_note()})")
    log.info("corpus %s: manifests missing in %s, generating them (once)", data.corpus, root)
    # the schema's synth_corpus section sizes the built-in corpus; other preparers take no options
    options = OmegaConf.to_container(cfg.synth_corpus, resolve=True) if data.corpus == "synth" else {}
    try:
        report = preparer(root, progress=True, **options)
    except ValueError as error:   # an option value it refuses, or data.root made with other settings
        raise ConfigError(f"corpus {data.corpus} in data.root={str(root)!r}: {error}") from None
    log.info("corpus %s: %s", data.corpus, report)


@contextmanager
def one_process_at_a_time(lock_file: Path):
    """Processes of one run that an outside launcher starts together (torchrun, srun) generate the
    synth corpus and compute features and statistics one after another: the first does the work,
    the others find it on disk (the caches' writes are not safe against concurrent writers).
    Lightning's own launcher starts the other processes only after this one has prepared the data."""
    lock_file.parent.mkdir(parents=True, exist_ok=True)
    with open(lock_file, "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


# ---- callbacks -----------------------------------------------------------------------------------
class BatchRecorder(Callback):
    """trainer.record_batches=true: each process appends one JSON line per batch it runs to
    <run folder>/batches/rank<global rank>.jsonl: {"fn": fit|validate|test, "stage": train|val|test,
    "epoch", "batch", "ids": [utterance ids], "padding": stand-in batch (asr.data.batching)}.
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


class AtomicCheckpointIO(TorchCheckpointIO):
    """Writes each checkpoint to a temporary file in its folder, fsyncs it, and renames it over the
    old one, so `last.ckpt` and `best.ckpt` are always either the old or the new file, whole: a run
    killed (kill -9, out of memory, a lost machine) during a write leaves at most a stray
    `.<name>.*.tmp`, never a truncated checkpoint that a resume would then trust."""

    def save_checkpoint(self, checkpoint: dict, path, storage_options=None) -> None:
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        descriptor, temporary = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
        try:
            with os.fdopen(descriptor, "wb") as handle:
                torch.save(checkpoint, handle)
                handle.flush()
                os.fsync(handle.fileno())
            if path.exists():
                pause_point("checkpoint_replace")   # the fault suite kills here (asr.fault_injection)
            os.replace(temporary, path)
        except BaseException:
            Path(temporary).unlink(missing_ok=True)
            raise
        folder = os.open(path.parent, os.O_RDONLY)   # the rename itself survives a power loss
        try:
            os.fsync(folder)
        finally:
            os.close(folder)


class EpochCheckpoint(ModelCheckpoint):
    """Keeps every epoch's checkpoint; its own class so Lightning keeps its state apart from `latest`'s."""


def build_trainer(cfg: DictConfig, run_dir: Path, timer: EpochTimer
                  ) -> tuple[L.Trainer, ModelCheckpoint, ModelCheckpoint]:
    """The Trainer, and its checkpoints of the best (lowest primary error) and of the latest epoch."""
    t = cfg.trainer
    tensorboard = TensorBoardLogger(save_dir=str(run_dir), name="logs", default_hp_metric=False)
    csv = CSVLogger(save_dir=str(run_dir), name="logs", version=tensorboard.version)
    best = ModelCheckpoint(dirpath=run_dir / "checkpoints", filename="best", monitor="val/primary_error",
                           mode="min", save_top_k=1, enable_version_counter=False)
    # Not save_last=True: Lightning (2.6) rewrites that last.ckpt only in epochs where `best` improved,
    # so it could hold an older epoch than the latest one. A checkpoint without a monitor keeps the
    # newest epoch, rewritten at the end of every epoch (what ckpt_path=last resumes).
    latest = ModelCheckpoint(dirpath=run_dir / "checkpoints", filename="last", save_top_k=1,
                             enable_version_counter=False)
    callbacks: list[Callback] = [best, latest, timer]
    if t.keep_epoch_checkpoints:   # for asr.average: each epoch's weights, with its validation rates
        callbacks.append(EpochCheckpoint(dirpath=run_dir / "checkpoints", filename="epoch-{epoch:03d}",
                                         save_top_k=-1, auto_insert_metric_name=False,
                                         enable_version_counter=False))
    if t.enable_progress_bar:   # k/N with an ETA, and the time budget left (asr.progress)
        callbacks.append(EpochProgressBar())
    if t.max_steps > 0:   # the step budget's end, estimated: one log line early on, and on the bar
        callbacks.append(StepBudgetEstimate())
    if t.record_batches:
        callbacks.append(BatchRecorder(run_dir / "batches"))
    if t.diagnostics_every_n_steps:
        callbacks.append(TrainingDiagnostics(t.diagnostics_every_n_steps, run_dir / "diagnostics.csv"))
    if t.early_stopping_patience:
        callbacks.append(EarlyStopping(monitor="val/primary_error", mode="min",
                                       patience=t.early_stopping_patience))
    limits = {key: (int(value) if value > 1 else float(value))
              for key in ("limit_train_batches", "limit_val_batches", "limit_test_batches")
              if (value := t[key]) is not None}
    trainer = L.Trainer(
        # CSV first: it warns about a non-empty folder if TensorBoard has written there before it
        default_root_dir=str(run_dir), logger=[csv, tensorboard], callbacks=callbacks,
        max_epochs=t.max_epochs, max_steps=t.max_steps,
        max_time=None if t.max_minutes is None else {"minutes": float(t.max_minutes)},
        accelerator=t.accelerator, devices=t.devices, num_nodes=t.num_nodes, strategy=t.strategy,
        precision=t.precision,
        gradient_clip_val=cfg.optim.clip_norm or None, gradient_clip_algorithm="norm",
        log_every_n_steps=t.log_every_n_steps,
        val_check_interval=t.val_check_interval,   # None: after each epoch (and no info line about it)
        check_val_every_n_epoch=t.check_val_every_n_epoch, num_sanity_val_steps=t.num_sanity_val_steps,
        enable_progress_bar=t.enable_progress_bar, deterministic=t.deterministic,
        use_distributed_sampler=False,   # the data module's lhotse samplers shard by rank themselves
        plugins=[AtomicCheckpointIO()],
        **limits)
    return trainer, best, latest


@contextmanager
def ctrl_c_as_keyboard_interrupt(trainer: L.Trainer):
    """Lightning turns Ctrl-C inside fit and test into sys.exit(1) after its own clean shutdown;
    raise it again as the KeyboardInterrupt it was, so the command can exit with INTERRUPTED."""
    try:
        yield
    except SystemExit:
        if trainer.interrupted:
            raise KeyboardInterrupt from None
        raise


# ---- the run -------------------------------------------------------------------------------------
def train(cfg: DictConfig, run_dir: Path) -> dict:
    """Trains (or resumes) one run in `run_dir`, tests its best checkpoint, writes results.json."""
    started = time.perf_counter()
    # everything that can be checked is checked before the run folder gets anything of ours
    attention = validate_config(cfg)
    check_launch_shares_run_folder(cfg.run_dir)
    resume_from, checkpoint = resolve_checkpoint(cfg.ckpt_path, run_dir)
    if corpus_preparer(cfg.data.corpus) is None:
        ensure_corpus(cfg)   # a real corpus is only checked, never prepared: its missing manifests stop us here
    if cfg.trainer.torch_threads:
        torch.set_num_threads(cfg.trainer.torch_threads)
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "config.yaml").write_text(OmegaConf.to_yaml(cfg, resolve=True))
    L.seed_everything(cfg.seed, workers=True)
    datamodule = SpeechDataModule(cfg.data, frame_subsampling=cfg.model.subsampling, seed=cfg.seed)
    if checkpoint is not None:
        datamodule.set_tokenizers(checkpoint["hyper_parameters"]["tokenizers"])
    with one_process_at_a_time(run_dir / ".data_preparation.lock"):
        ensure_corpus(cfg)
        # the corpus's lexicon and LM travel with the run folder (asr.decoding.evaluation.model_decoding_files)
        keep_decoding_files_in_run(run_dir, cfg.data.root)
        datamodule.setup("fit")
        if cfg.test:   # the test split's features too, now, not concurrently by every process later
            datamodule.setup("test")
    model = SpeechRecognizer(
        model=OmegaConf.to_container(cfg.model, resolve=True),
        attention=attention,
        optim=OmegaConf.to_container(cfg.optim, resolve=True),
        feature_dim=datamodule.feature_dim,
        tokenizers={kind: tokenizer.state_dict() for kind, tokenizer in datamodule.tokenizers.items()},
        frontend=datamodule.filterbank.options)
    model.set_feature_stats(datamodule.feature_mean, datamodule.feature_std)
    if cfg.trainer.compile:
        compile_encoder(model.encoder)
    if checkpoint is not None:
        check_state_dict_fits(model, checkpoint["state_dict"], f"checkpoint {resume_from}")
        log.info("resuming from %s (epoch %s, step %s)", resume_from, checkpoint.get("epoch"),
                 checkpoint.get("global_step"))
        del checkpoint
    parameters = sum(p.numel() for p in model.parameters())
    log.info("model: %d parameters, attention %s %s, targets %s", parameters, attention.name,
             attention.options, list(datamodule.tokenizers))

    timer = EpochTimer()
    trainer, best, latest = build_trainer(cfg, run_dir, timer)
    with ctrl_c_as_keyboard_interrupt(trainer):
        trainer.fit(model, datamodule=datamodule, ckpt_path=str(resume_from) if resume_from else None)
    log.info("training stopped: %s", stop_reason(trainer))

    best_path = best.best_model_path or latest.best_model_path   # the latest one when nothing was validated
    results = {
        "preset": _preset_name(), "run_dir": str(run_dir), "attention": attention.name,
        "attention_options": attention.options, "parameters": parameters,
        "epochs": trainer.current_epoch, "steps": trainer.global_step,
        "seconds_per_epoch": _mean([e["seconds"] for e in timer.epochs]),
        "train_seconds_per_epoch": _mean([e["train_seconds"] for e in timer.epochs]),
        "epoch_times": timer.epochs, "best_checkpoint": best_path,
        "best_val_primary_error": None if best.best_model_score is None else float(best.best_model_score),
        "val": getattr(model, "last_error_rates", {}).get("val", {}),
    }
    if cfg.test and best_path:
        with ctrl_c_as_keyboard_interrupt(trainer):
            metrics = trainer.test(model, datamodule=datamodule, ckpt_path=best_path)
        for name, value in sorted((metrics or [{}])[0].items()):   # Lightning printed them as a table
            file_log.info("%-24s %s", name, value)
        results["test"] = model.last_error_rates.get("test", {})
        if trainer.is_global_zero:   # words through the run's lexicon and LM, when the corpus shipped them
            from asr.evaluate import lexicon_test_rates
            results["test"].update(lexicon_test_rates(best_path, bool(cfg.data.progress)) or {})
    results["wall_seconds"] = time.perf_counter() - started   # of this start (a resumed run counts anew)
    if trainer.is_global_zero:   # every process has the same gathered error rates; one writes them
        (run_dir / "results.json").write_text(json.dumps(results, indent=2) + "\n")
    return results


def stop_reason(trainer: L.Trainer) -> str:
    """Why fit returned: the time budget, early stopping, the step budget or the epochs."""
    where = f"after {trainer.current_epoch} epoch(s), {trainer.global_step} steps"
    timer = next((c for c in trainer.callbacks if isinstance(c, Timer)), None)
    if timer is not None and timer.time_remaining() is not None and timer.time_remaining() <= 0:
        return f"the time budget trainer.max_minutes={timer._duration / 60:g} ran out {where}"
    early = next((c for c in trainer.callbacks if isinstance(c, EarlyStopping)), None)
    if early is not None and early.stopped_epoch:
        return f"early stopping: no better {early.monitor} for {early.patience} validations, {where}"
    if trainer.max_steps is not None and 0 < trainer.max_steps <= trainer.global_step:
        return f"the step budget trainer.max_steps={trainer.max_steps} was reached {where}"
    if trainer.max_epochs is not None and 0 < trainer.max_epochs <= trainer.current_epoch:
        return f"trainer.max_epochs={trainer.max_epochs} epochs done ({trainer.global_step} steps)"
    return f"Lightning ended fit {where}"


def train_log_keeps_the_console() -> None:
    """The run folder's train.log (Hydra's file handler on the root logger) gets, besides our log
    lines: Lightning's (its logger does not propagate to the root: it got its own console handler
    when imported before Hydra set up logging), warnings that pass the filters, and through
    `file_log` what the console shows by print. Progress bars stay on the console only."""
    files = [handler for handler in logging.getLogger().handlers if isinstance(handler, logging.FileHandler)]
    for name in ("lightning.pytorch", "lightning.fabric"):
        logger = logging.getLogger(name)
        if not logger.propagate:
            for handler in files:
                if handler not in logger.handlers:
                    logger.addHandler(handler)
    logging.captureWarnings(True)   # py.warnings -> the root logger: the console's log lines and train.log
    file_log.handlers = files


def say(text: str, stream=None) -> None:
    """Print a line of the command's own (the result, an error, the resume hint) and keep it in train.log."""
    print(text, file=stream or sys.stdout)
    file_log.info(text.strip())


def _mean(values: list[float]) -> float | None:
    return sum(values) / len(values) if values else None


def _preset_name() -> str | None:
    try:
        return HydraConfig.get().runtime.choices.get("conf")
    except ValueError:   # called outside Hydra (tests)
        return None


# ---- the command: exit statuses (asr.exit_status), the run folder of a run that never started --------
USAGE_ERRORS = (ConfigError, AttentionConfigError, CheckpointError, CheckpointMismatchError, ManifestError)
# What a run folder holds before the run has produced anything: Hydra's record (.hydra/), the log,
# the resolved config, the data-preparation lock and the copies of the corpus's lexicon and LM.
BOOKKEEPING = {".hydra", "train.log", "config.yaml", ".data_preparation.lock", "decoding"}
_task_started = False   # set by the Hydra task; before it, a failure is Hydra's composition of the config


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


def resume_hint(run_dir: Path) -> str:
    """How to continue an interrupted run: its own command with run_dir=<its folder> ckpt_path=last,
    or, before its first epoch finished, the same command again."""
    overrides = [o for o in HydraConfig.get().overrides.task
                 if not o.startswith(("ckpt_path=", "run_dir=", "+ckpt_path=", "+run_dir="))]
    if not (run_dir / "checkpoints" / "last.ckpt").is_file():
        return "no epoch had finished, so there is no checkpoint to resume from; run the same command again"
    relative = os.path.relpath(run_dir)
    folder = str(run_dir) if relative.startswith("..") else relative
    command = " ".join(["python -m asr.train", *map(shlex.quote, overrides),
                        shlex.quote(f"run_dir={folder}"), "ckpt_path=last"])
    return f"resume from the last finished epoch with: {command}"


@hydra.main(config_path="../conf", config_name="config", version_base="1.3")
def run(cfg: DictConfig) -> None:
    """The Hydra task: trains, and ends the process with the exit status of what happened."""
    global _task_started
    _task_started = True
    install_warning_filters()
    train_log_keeps_the_console()
    run_dir = Path(HydraConfig.get().runtime.output_dir)
    try:
        results = train(cfg, run_dir)
    except USAGE_ERRORS as error:
        remove_unused_run_folder(run_dir, cfg.run_dir)
        say(f"asr.train: error: {error}", sys.stderr)
        raise SystemExit(USAGE_ERROR) from None
    except KeyboardInterrupt:
        say(f"\nasr.train: interrupted; {resume_hint(run_dir)}", sys.stderr)
        raise SystemExit(INTERRUPTED) from None
    except Exception:   # the console gets Hydra's report of it; train.log the reason the run stopped
        file_log.exception("asr.train: stopped by an error")
        raise
    if rank_zero_only.rank != 0:   # the other processes of a multi-device run stay quiet
        return
    test = results.get("test", {})
    say(f"\nrun folder: {run_dir}")
    if test:
        say(f"test: PER {percent(test.get('per'))}  WER {percent(test.get('wer'))}  "
            f"CER {percent(test.get('cer'))}  (mean encoder length {test.get('encoder_length', 0):.0f})"
            + (f"\n      lexicon + LM: WER {percent(test['wer_lexicon'])}  CER {percent(test['cer_lexicon'])}"
               if "wer_lexicon" in test else ""))


def main() -> None:
    """python -m asr.train: Hydra's main with the project's exit statuses. Hydra exits with 1 for
    a config it cannot compose (an unknown key, a bad value type, a missing preset); that is a
    usage error (2). A failure inside the task stays 1."""
    exit_on_misspelt_override("asr.train", sys.argv[1:])
    try:
        run()
    except SystemExit as exit:
        if exit.code == FAILURE and not _task_started:
            raise SystemExit(USAGE_ERROR) from None
        raise
    except KeyboardInterrupt:   # before the task started (while Hydra composed the config)
        print("\nasr.train: interrupted", file=sys.stderr)
        raise SystemExit(INTERRUPTED) from None


if __name__ == "__main__":
    main()

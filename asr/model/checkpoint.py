"""Checkpoint files: the one place that opens a .ckpt and checks it can be used, and the one
writer (`AtomicCheckpointIO`: asr.train's checkpoints and asr.average's are whole or absent).

    checkpoint = read_checkpoint("runs/synth_full/<time>/checkpoints/best.ckpt")
    checkpoint["hyper_parameters"]   # model, attention, optim, feature_dim, tokenizers, frontend
    checkpoint["state_dict"]         # the weights and the feature statistics
    feature_frontend(checkpoint["hyper_parameters"])   # the FilterBank the model was trained on

Every command that takes a checkpoint (asr.evaluate, asr.cross_matrix, asr.train ckpt_path=) reads
it here, so a missing file, a file of another kind, a truncated file, a checkpoint of another
format version or one trained with an attention this build lacks gives the same one-line
CheckpointError naming the file, instead of a traceback from deep inside torch.load.

Format versions: SpeechRecognizer.on_save_checkpoint writes CHECKPOINT_FORMAT under FORMAT_KEY.
Checkpoints written before the number existed have no FORMAT_KEY; with the expected keys they are
format 1. Raise CHECKPOINT_FORMAT when a change makes older readers misread new checkpoints.
  1  the front-end was implied: Kaldi fbank with FilterBank's defaults and feature_dim mel bins
  2  hyper_parameters["frontend"] holds the FilterBank's options (FilterBank.options), so a
     checkpoint alone says how to compute its features (asr.transcribe); format 1 is read by
     filling in the options it implied, which is exactly what every format-1 run computed

A checkpoint that cannot be read names, in its error, the other checkpoints of its folder that can
(`usable_checkpoints`); `newest_usable_checkpoint` is what `asr.train ckpt_path=last` resumes from
when last.ckpt itself is damaged.
"""
from __future__ import annotations

import os
import pickle
import tempfile
import zipfile
from pathlib import Path

import torch
from lightning.pytorch.plugins.io import TorchCheckpointIO

from asr.data.features.features import FilterBank
from asr.core.fault_injection import pause_point
from asr.core.output_paths import disk_full
from attention_ext import AttentionConfigError, available_attentions, validate_attention

FORMAT_KEY = "asr_checkpoint_format"
CHECKPOINT_FORMAT = 2
OLDEST_READABLE_FORMAT = 1
HYPER_PARAMETERS = ("model", "attention", "optim", "feature_dim", "tokenizers", "frontend")


class CheckpointError(ValueError):
    """A checkpoint that cannot be used; the message is one line that names the file."""


def read_checkpoint(path: str | Path) -> dict:
    """The checkpoint at `path` (tensors on the CPU), checked to be an asr.train checkpoint this
    version can use; CheckpointError otherwise, naming the checkpoints beside it that can be used."""
    path = Path(path)
    try:
        return _read(path)
    except CheckpointError as error:
        alternatives = usable_checkpoints(path.parent, exclude=path) if path.is_file() else []
        if not alternatives:
            raise
        raise CheckpointError(f"{error}; checkpoints in the same folder that can be used (newest first): "
                              f"{', '.join(map(str, alternatives))}") from None


def checkpoints_newest_first(folder: str | Path) -> list[Path]:
    """The .ckpt files of `folder`, newest first (last.ckpt first among files written at the same time).
    Temporary files of an interrupted write (`.last.ckpt.*.tmp`) are not checkpoints."""
    files = [p for p in Path(folder).glob("*.ckpt") if p.is_file() and not p.name.startswith(".")]
    return sorted(files, key=lambda p: (p.stat().st_mtime, p.name == "last.ckpt"), reverse=True)


def usable_checkpoints(folder: str | Path, exclude: Path | None = None) -> list[Path]:
    """The checkpoints of `folder` that read_checkpoint accepts, newest first."""
    usable = []
    for candidate in checkpoints_newest_first(folder):
        if exclude is not None and candidate.resolve() == exclude.resolve():
            continue
        try:
            _read(candidate)
        except CheckpointError:
            continue
        usable.append(candidate)
    return usable


def newest_usable_checkpoint(folder: str | Path) -> tuple[Path, dict, list[str]] | None:
    """(path, checkpoint, why each newer file was passed over) for the newest checkpoint of `folder`
    that can be used; None when the folder holds no .ckpt file. CheckpointError, naming every file
    and its problem, when it holds some and none can be used."""
    skipped = []
    for candidate in checkpoints_newest_first(folder):
        try:
            return candidate, _read(candidate), skipped
        except CheckpointError as error:
            skipped.append(str(error))
    if skipped:
        raise CheckpointError(f"no checkpoint in {folder} can be used: " + "; ".join(skipped))
    return None


def _read(path: Path) -> dict:
    where = f"checkpoint {path}"
    if not path.exists():
        raise CheckpointError(f"{where}: no such file; give a .ckpt written by asr.train "
                              "(runs/<preset>/<time>/checkpoints/best.ckpt)")
    if path.is_dir():
        inside = path / "checkpoints" / "best.ckpt"
        raise CheckpointError(f"{where} is a folder; give a .ckpt file"
                              + (f" (this run's best is {inside})" if inside.is_file() else ""))
    # torch.save writes a zip archive; anything else (a text file, a truncated download) would
    # otherwise fail inside the unpickler with an error that says nothing about the file
    try:
        is_archive = zipfile.is_zipfile(path)
    except OSError as error:
        raise CheckpointError(f"{where} cannot be read ({error.strerror or error})") from None
    if not is_archive:
        raise CheckpointError(f"{where} is not a PyTorch checkpoint (not the zip archive torch.save writes: "
                              "truncated, or another kind of file)")
    try:
        # weights_only: asr.train writes tensors and plain values only, so nothing is unpickled
        # that could run code
        checkpoint = torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError:
        raise CheckpointError(f"{where} holds Python objects besides tensors and plain values, so it was not "
                              "written by asr.train; it was not loaded") from None
    except Exception as error:   # torch.load reports a damaged archive with many exception types
        reason = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        raise CheckpointError(f"{where} is damaged: torch.load cannot read it ({reason})") from None
    _check_contents(checkpoint, where)
    return checkpoint


def _check_contents(checkpoint, where: str) -> None:
    """Raises CheckpointError unless `checkpoint` is an asr.train checkpoint this version can use."""
    hyper_parameters = checkpoint.get("hyper_parameters") if isinstance(checkpoint, dict) else None
    if not isinstance(hyper_parameters, dict) or not isinstance(checkpoint.get("state_dict"), dict):
        raise CheckpointError(f"{where} is not an asr.train checkpoint (it has no Lightning state_dict and "
                              "hyper_parameters)")
    version = checkpoint.get(FORMAT_KEY, 1)
    if isinstance(version, bool) or not isinstance(version, int):
        raise CheckpointError(f"{where} is not an asr.train checkpoint ({FORMAT_KEY}={version!r} is not a number)")
    if version > CHECKPOINT_FORMAT:
        raise CheckpointError(f"{where} was written by a newer version of this toolkit (checkpoint format "
                              f"{version}; this version reads format {CHECKPOINT_FORMAT}); update the toolkit")
    if version < OLDEST_READABLE_FORMAT:
        raise CheckpointError(f"{where} has checkpoint format {version}, older than this version reads "
                              f"(formats {OLDEST_READABLE_FORMAT} to {CHECKPOINT_FORMAT}); use the toolkit "
                              "version that wrote it")
    if version == 1 and isinstance(hyper_parameters.get("feature_dim"), int):
        # format 1 implied the front-end: FilterBank's defaults with feature_dim mel bins
        hyper_parameters.setdefault("frontend", FilterBank(hyper_parameters["feature_dim"]).options)
    missing = [key for key in HYPER_PARAMETERS if key not in hyper_parameters]
    if missing:
        raise CheckpointError(f"{where} is not an asr.train checkpoint (its hyper_parameters lack "
                              f"{', '.join(missing)}; a checkpoint of another Lightning model?)")
    attention = hyper_parameters["attention"]
    name = attention.get("name") if isinstance(attention, dict) else None
    known = available_attentions()
    if name not in known:
        raise CheckpointError(f"{where} was trained with attention {name!r}, which this build of attention_ext "
                              f"does not have (it has {', '.join(known)})")
    try:
        validate_attention(**attention)
    except AttentionConfigError as error:
        raise CheckpointError(f"{where}: its attention options do not fit this build of attention_ext "
                              f"({str(error).splitlines()[0]})") from None
    try:
        feature_frontend(hyper_parameters)
    except ValueError as error:
        raise CheckpointError(f"{where}: {error}") from None


def feature_frontend(hyper_parameters: dict) -> FilterBank:
    """The feature front-end a model was trained on, from its hyper-parameters (the one place that
    reads them): features for the model must be computed by this FilterBank. ValueError if the
    stored options are not ones this toolkit computes or do not give feature_dim bins."""
    options = hyper_parameters.get("frontend")
    if options is None:      # a model built in code without a front-end: FilterBank's defaults
        return FilterBank(hyper_parameters["feature_dim"])
    if not isinstance(options, dict):
        raise ValueError(f"its front-end options are {options!r}, not a dict of FilterBank options")
    frontend = FilterBank.from_options(options)
    if frontend.num_mel_bins != hyper_parameters["feature_dim"]:
        raise ValueError(f"its front-end computes {frontend.num_mel_bins} mel bins, but the model takes "
                         f"feature_dim={hyper_parameters['feature_dim']}")
    return frontend


class AtomicCheckpointIO(TorchCheckpointIO):
    """Writes each checkpoint to a temporary file in its folder, fsyncs it, and renames it over the
    old one, so `last.ckpt` and `best.ckpt` are always either the old or the new file, whole: a run
    killed (kill -9, out of memory, a lost machine) during a write leaves at most a stray
    `.<name>.*.tmp`, never a truncated checkpoint that a resume would then trust. A full disk is a
    DiskFullError naming the checkpoint (asr.core.output_paths).

    Reads as `read_checkpoint` does (weights_only, whatever TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD says), so
    the file Lightning opens itself for a resume (trainer.fit(ckpt_path=...)) or a test
    (trainer.test(ckpt_path=...)) cannot run code either, even if it was swapped after our own check."""

    def load_checkpoint(self, path, map_location=None, weights_only=None) -> dict:
        return _read(Path(path))   # CPU tensors: what Lightning's own map_location gives

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
                pause_point("checkpoint_replace")   # the fault suite kills here (asr.core.fault_injection)
            os.replace(temporary, path)
        except BaseException as error:
            Path(temporary).unlink(missing_ok=True)
            full = disk_full(error, path)
            if full is not None:   # torch says "unexpected pos"; the full disk is only its context
                raise full from None
            raise
        folder = os.open(path.parent, os.O_RDONLY)   # the rename itself survives a power loss
        try:
            os.fsync(folder)
        finally:
            os.close(folder)

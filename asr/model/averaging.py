"""Averaging the weights of several checkpoints of one model into one checkpoint.

The average is the element-wise mean of every floating-point tensor of the state dict (computed in
float64); the hyper-parameters (model, attention, optimiser settings, tokenizers, front-end) and the
feature normalisation statistics are those of the checkpoints, which must agree: checkpoints of
models of other shapes, other tokenizers, another front-end or other statistics are refused. The
result holds no optimiser state, so training cannot resume from it. `choose_from_run` picks among a
run's per-epoch checkpoints (checkpoints/epoch-NNN.ckpt, kept with trainer.keep_epoch_checkpoints=true)
by the validation rates each one stores, or by epoch. `python -m asr.average` is the command.
"""
from __future__ import annotations

from pathlib import Path
from typing import Optional

import torch

from asr.model.checkpoint import CHECKPOINT_FORMAT, FORMAT_KEY, AtomicCheckpointIO, read_checkpoint

EPOCH_CHECKPOINTS = "epoch-*.ckpt"
# must agree between the averaged checkpoints (the attention may differ: it has no weights)
MUST_AGREE = ("model", "feature_dim", "tokenizers", "frontend")
STATISTICS = ("feature_mean", "feature_std")


class AveragingError(ValueError):
    """Checkpoints that cannot be averaged, or a bad argument; the message says which and why."""


def validation_error(checkpoint: dict, path: Path) -> tuple[float, str]:
    """(validation PER, 'PER'), or WER for a model without a phone head, as the checkpoint stores it."""
    rates = checkpoint.get("val_error_rates") or {}
    for name in ("per", "wer"):
        if name in rates:
            return float(rates[name]), name.upper()
    raise AveragingError(f"checkpoint {path} stores no validation error rates (written before asr.train kept "
                         "them, or before the first validation); choose with checkpoints=A,B,C instead")


def choose_from_run(run: Path, best_k: Optional[int], last_k: Optional[int]) -> list[Path]:
    """The run's per-epoch checkpoints to average: the best_k lowest validation errors, or the
    last_k epochs."""
    folder = run / "checkpoints"
    found = sorted(folder.glob(EPOCH_CHECKPOINTS))
    if not found:
        raise AveragingError(f"run {run} has no per-epoch checkpoints ({folder}/{EPOCH_CHECKPOINTS}); train with "
                             "trainer.keep_epoch_checkpoints=true, or give checkpoints=A,B,C")
    k = best_k or last_k
    if k > len(found):
        raise AveragingError(f"{'best_k' if best_k else 'last_k'}={k}, but run {run} has {len(found)} per-epoch "
                             "checkpoints")
    if last_k:
        return found[-last_k:]
    errors = {path: validation_error(read_checkpoint(path), path)[0] for path in found}
    return sorted(sorted(found, key=errors.__getitem__)[:best_k])


def average_checkpoints(paths: list[Path]) -> dict:
    """The checkpoint whose weights are the mean of those of `paths`; AveragingError if they are
    not checkpoints of one model (CheckpointError for a file that is no usable checkpoint)."""
    if not paths:
        raise AveragingError("no checkpoints to average")
    first_path, first = paths[0], read_checkpoint(paths[0])
    hyper = first["hyper_parameters"]
    sums = {name: tensor.double() if tensor.is_floating_point() else tensor
            for name, tensor in first["state_dict"].items()}
    last = first
    for path in paths[1:]:
        other = last = read_checkpoint(path)
        for key in MUST_AGREE:
            if other["hyper_parameters"][key] != hyper[key]:
                raise AveragingError(f"checkpoints {first_path} and {path} have different {key}: they are not "
                                     "checkpoints of one model and cannot be averaged")
        state = other["state_dict"]
        if state.keys() != sums.keys():
            differing = sorted(set(state) ^ set(sums))
            raise AveragingError(f"checkpoints {first_path} and {path} hold different tensors ({differing[0]}, ...): "
                                 "models of different shapes cannot be averaged")
        for name, tensor in state.items():
            if tensor.shape != sums[name].shape:
                raise AveragingError(f"checkpoints {first_path} and {path} differ in the shape of {name} "
                                     f"({tuple(sums[name].shape)} and {tuple(tensor.shape)}): models of different "
                                     "shapes cannot be averaged")
            if name.split(".")[-1] in STATISTICS or not tensor.is_floating_point():
                if not torch.equal(tensor, first["state_dict"][name]):
                    raise AveragingError(f"checkpoints {first_path} and {path} have different {name} (feature "
                                         "normalisation statistics of another training set): they cannot be averaged")
                continue
            sums[name] += tensor.double()
    state_dict = {name: (total / len(paths)).to(first["state_dict"][name].dtype) if total.is_floating_point()
                  and name.split(".")[-1] not in STATISTICS else first["state_dict"][name]
                  for name, total in sums.items()}
    averaged = {FORMAT_KEY: CHECKPOINT_FORMAT, "hyper_parameters": hyper, "state_dict": state_dict,
                "averaged_from": [str(path) for path in paths]}
    for key in ("pytorch-lightning_version", "epoch", "global_step"):   # the last one's, for Lightning's reader
        if key in last:
            averaged[key] = last[key]
    return averaged


def write_average(paths: list[Path], out: Path) -> dict:
    """Averages `paths` (average_checkpoints) into `out`, written as asr.train writes checkpoints:
    whole or not at all; returns the average."""
    if out.resolve() in {p.resolve() for p in paths}:
        raise AveragingError(f"out={out} is one of the checkpoints to average; write the average elsewhere")
    averaged = average_checkpoints(paths)
    AtomicCheckpointIO().save_checkpoint(averaged, out)
    return averaged

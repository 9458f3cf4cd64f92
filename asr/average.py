"""Average the weights of several checkpoints of one model into one checkpoint.

    python -m asr.average checkpoints=a.ckpt,b.ckpt,c.ckpt out=avg.ckpt
    python -m asr.average run=runs/synth_full/<time> best_k=5     # the 5 lowest validation PERs
    python -m asr.average run=runs/synth_full/<time> last_k=3     # the last 3 epochs

`run=` picks among the run's per-epoch checkpoints (checkpoints/epoch-NNN.ckpt, which asr.train
keeps with trainer.keep_epoch_checkpoints=true): `best_k` those with the lowest validation PER (the
rates each checkpoint stores; WER for a model without a phone head), `last_k` the latest epochs. The
default `out` is then <run>/checkpoints/average-best<k>.ckpt (or average-last<k>.ckpt), inside the
run folder, so asr.evaluate finds the run's corpus as for best.ckpt.

The average is the element-wise mean of every floating-point tensor of the state dict (computed in
float64); the hyper-parameters (model, attention, optimiser settings, tokenizers, front-end) and the
feature normalisation statistics are those of the checkpoints, which must agree: checkpoints of
models of other shapes, other tokenizers, another front-end or other statistics are refused. The
result is read by asr.evaluate, asr.cross_matrix and asr.transcribe like any checkpoint; it holds
no optimiser state, so training cannot resume from it.
"""
from __future__ import annotations

import sys
from pathlib import Path
from typing import Optional

import torch

from asr.config.command_line import run_key_value_command
from asr.model.checkpoint import (CHECKPOINT_FORMAT, FORMAT_KEY, AtomicCheckpointIO, CheckpointError,
                                  read_checkpoint)

COMMAND = "asr.average"
EPOCH_CHECKPOINTS = "epoch-*.ckpt"
# must agree between the averaged checkpoints (the attention may differ: it has no weights)
MUST_AGREE = ("model", "feature_dim", "tokenizers", "frontend")
STATISTICS = ("feature_mean", "feature_std")


class AveragingError(ValueError):
    """Checkpoints that cannot be averaged, or a bad argument; the message says which and why."""


def parse_arguments(argv: list[str]) -> dict:
    options = {"checkpoints": None, "run": None, "best_k": None, "last_k": None, "out": None}
    for argument in argv:
        key, equals, value = argument.partition("=")
        if not equals or key not in options:
            raise AveragingError(f"argument {argument!r} is not one of {', '.join(k + '=' for k in options)}")
        options[key] = value
    for key in ("best_k", "last_k"):
        if options[key] is not None:
            if not options[key].isdigit() or int(options[key]) < 1:
                raise AveragingError(f"{key}={options[key]!r} must be a whole number >= 1")
            options[key] = int(options[key])
    by_list, by_run = options["checkpoints"] is not None, options["run"] is not None
    if by_list == by_run:
        raise AveragingError("give either checkpoints=A,B,C out=PATH or run=RUN_DIR with best_k=K or last_k=K")
    if by_list and (options["best_k"] or options["last_k"]):
        raise AveragingError("best_k= and last_k= choose among a run's checkpoints: give run=RUN_DIR with them")
    if by_run and (options["best_k"] is None) == (options["last_k"] is None):
        raise AveragingError("with run=RUN_DIR give one of best_k=K (lowest validation PER) or last_k=K (last epochs)")
    if by_list and not options["out"]:
        raise AveragingError("give where to write the average: out=PATH")
    return options


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


def average(options: dict) -> Path:
    if options["run"] is not None:
        run = Path(options["run"])
        if not (run / "checkpoints").is_dir():
            raise AveragingError(f"run={run} is not an asr.train run folder (it has no checkpoints/)")
        paths = choose_from_run(run, options["best_k"], options["last_k"])
        name = f"average-best{options['best_k']}.ckpt" if options["best_k"] else f"average-last{options['last_k']}.ckpt"
        out = Path(options["out"]) if options["out"] else run / "checkpoints" / name
    else:
        paths = [Path(p) for p in options["checkpoints"].split(",") if p]
        out = Path(options["out"])
    if out.resolve() in {p.resolve() for p in paths}:
        raise AveragingError(f"out={out} is one of the checkpoints to average; write the average elsewhere")
    averaged = average_checkpoints(paths)
    AtomicCheckpointIO().save_checkpoint(averaged, out)   # as asr.train writes them: whole or not at all
    print(f"averaged {len(paths)} checkpoints: {', '.join(str(p) for p in paths)}")
    print(f"wrote {out}")
    return out


def main(argv: list[str] | None = None) -> int:
    return run_key_value_command(COMMAND, __doc__, lambda arguments: average(parse_arguments(arguments)) and None,
                                 argv, usage_errors=(AveragingError, CheckpointError))


if __name__ == "__main__":
    sys.exit(main())

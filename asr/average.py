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

from asr.config.command_line import run_key_value_command
from asr.model.averaging import AveragingError, choose_from_run, write_average
from asr.model.checkpoint import CheckpointError

COMMAND = "asr.average"


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
    write_average(paths, out)
    print(f"averaged {len(paths)} checkpoints: {', '.join(str(p) for p in paths)}")
    print(f"wrote {out}")
    return out


def main(argv: list[str] | None = None) -> int:
    return run_key_value_command(COMMAND, __doc__, lambda arguments: average(parse_arguments(arguments)) and None,
                                 argv, usage_errors=(AveragingError, CheckpointError))


if __name__ == "__main__":
    sys.exit(main())

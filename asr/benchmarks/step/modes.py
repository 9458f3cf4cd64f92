"""How a benchmarked step runs its encoder: eager, compiled or graphed, the same for both models.

- eager: as written.
- compiled: torch.compile of the encoder - the toolkit's through `compile_encoder` (what
  `trainer.compile=true` does), the plain model's `encode` with torch.compile's defaults. The
  benchmark's batches all have one shape, so each compiles once, in the warm-up rounds.
- graphed: the encoder's forward and backward replayed as a CUDA graph (`GraphedForward`, what
  `trainer.cuda_graphs=true` does); captured in the first warm-up round. A GPU only.
- compiled-graphs: torch.compile with inductor's CUDA graphs (mode="reduce-overhead"), the
  alternative asr.model.graphed_encoder did not take, to measure the choice. A GPU only; not in the
  GPU report's default parts (its compilations cost what the compiled mode's do, again).

In both models the encoder is the part from the normalised features to the final layer norm's
states; normalisation, the CTC heads, the loss, clipping and RAdam run eagerly around it, as in
asr.train.
"""
from __future__ import annotations

import torch

from asr.model.encoder import compile_encoder
from asr.model.graphed_encoder import GraphedForward, graph_encoder
from asr.benchmarks.step.workloads import PLAIN, TrainedModel

MODES = ("eager", "compiled", "graphed", "compiled-graphs")
GPU_MODES = ("graphed", "compiled-graphs")
PRECISIONS = ("32-true", "bf16-mixed")


def mode_problem(modes: list[str], device: str) -> str | None:
    """Why these modes cannot run on `device`, or None."""
    if device == "cuda" and not torch.cuda.is_available():
        return "--device cuda: this torch sees no CUDA device (torch.cuda.is_available() is False)"
    gpu_only = [mode for mode in modes if mode in GPU_MODES]
    if gpu_only and device != "cuda":
        return (f"--modes {' '.join(gpu_only)} replays CUDA graphs and needs --device cuda; on the CPU run eager "
                "and compiled (CUDA graphs remove kernel-launch overhead, which a CPU step does not have)")
    return None


def apply_mode(model: TrainedModel, mode: str, pool=None) -> None:
    """Compiles or graphs the model's encoder in place (eager: leaves it). `pool`: the CUDA graph
    memory pool the graphed models of one round share (they train one after another)."""
    if mode not in MODES:
        raise ValueError(f"mode {mode!r}; choose from {', '.join(MODES)}")
    if mode == "eager":
        return
    module = model.module
    if mode == "compiled-graphs":
        _mark_each_step(model)
    if model.label == PLAIN:
        encode = module.encode
        module.encode = (torch.compile(encode) if mode == "compiled"
                         else torch.compile(encode, mode="reduce-overhead") if mode == "compiled-graphs"
                         else GraphedForward(module, forward=encode, pool=pool))
    elif mode in ("compiled", "compiled-graphs"):
        compile_encoder(module.encoder, cuda_graphs=mode == "compiled-graphs")
    else:
        graph_encoder(module.encoder, pool=pool)


def _mark_each_step(model: TrainedModel) -> None:
    """Inductor's CUDA graphs reuse their outputs' memory from one step to the next; each step says
    where it begins (torch.compiler.cudagraph_mark_step_begin), as a training loop with them must."""
    step = model.step

    def marked_step(batch):
        torch.compiler.cudagraph_mark_step_begin()
        return step(batch)
    model.step = marked_step

"""`trainer.cuda_graphs=true`: the encoder's forward and backward replayed as CUDA graphs, one per
batch shape.

    graph_encoder(model.encoder)       # asr.train does it; the state dict and checkpoints are unchanged

A training step of the demo model is hundreds of small kernels, and on a GPU its time is mostly the
host launching them (attention_ext/RESULTS.md, "The GPU: status and known costs"). A CUDA graph launches them all at once.
A graph replays fixed shapes at fixed addresses, so the batches come padded to a few fixed shapes
(`data.fixed_batch_shapes`: one per duration bucket, asr.data.batching.duration_buckets) and each shape gets its own
graph, captured the first time it is seen; later batches of that shape are copied into the graph's
input and replayed. All graphs share one memory pool: a step runs one graph's forward and then its
backward, never two graphs at once, so what one graph frees may serve another.

Why `torch.cuda.make_graphed_callables` and not `torch.compile(mode="reduce-overhead")`:
- no compilation: capturing a shape costs four eager steps (three warm-ups on a side stream and the
  capture), not the minute and more that inductor takes per shape for this encoder (76 s for the
  first compiled steps on an H200), which a short run and the GPU report's budget cannot pay;
- it graphs exactly the encoder, whose kernels are ours and torch's, with no second compiler
  between them (inductor has already failed twice on this encoder: asr.model.encoder.compile_encoder);
- the graphs are ours to key, share memory between and count (`GraphedForward.graphs`).
It does not fuse kernels; `trainer.compile` does, and the two are not combined (asr.config.schema refuses it).
The step benchmark (`python -m asr.benchmarks.step --modes eager compiled graphed --device cuda`)
measures the three side by side.

What stays eager, outside the graphs: the features' normalisation and masking, the CTC heads and
`ctc_loss` (PyTorch's native CTC reads the lengths on the host), gradient clipping, the optimiser,
logging and the loss check (each reads a number on the host), and every pass that does not train
(validation, test, asr.evaluate: the module is in eval mode or gradients are off) - those run the
encoder's own forward, so swapping attention at evaluation is unaffected.

Randomness: dropout and the attentions' CUDA draws come from torch's CUDA generator, which a graph
advances at every replay (PyTorch registers it with the capture), so every step draws afresh and a
checkpoint's CUDA RNG state is where the steps left it. The warm-ups and the capture run inside
`torch.random.fork_rng`: capturing draws nothing from the streams the run continues with. Draws a
module makes on the CPU (clustered attention's hash planes: attention_ext/attentions/clustered.py) are not
captured: a graph replays the planes of its capture (the CUDA-graph-safe draws own that).

Not supported: accumulating gradients over several batches (param.grad may be the graph's own
gradient buffer, which the next replay overwrites; asr.train zeroes gradients every step).
"""
from __future__ import annotations

import logging
from contextlib import contextmanager, nullcontext
from typing import Any

import torch
from torch import nn

from attention_ext import set_input_validation

log = logging.getLogger(__name__)

# More shapes than this are run eagerly (and said once): fixed batch shapes give num_buckets of them.
MAX_GRAPHS = 64


def check_cuda_graph_options(trainer: Any, data: Any, on_cpu: bool) -> None:
    """Raises ValueError naming the option and the fix when trainer.cuda_graphs=true cannot work."""
    if not trainer.cuda_graphs:
        return
    if on_cpu:
        raise ValueError(f"trainer.cuda_graphs=true captures CUDA graphs, and this run trains on the CPU "
                         f"(trainer.accelerator={trainer.accelerator}); train on a GPU or set "
                         "trainer.cuda_graphs=false (data.fixed_batch_shapes=true alone works anywhere)")
    if not data.fixed_batch_shapes:
        raise ValueError("trainer.cuda_graphs=true needs data.fixed_batch_shapes=true: a graph replays one "
                         "batch shape, and without fixed shapes almost every batch has a new one "
                         "(trainer=gpu80 sets both)")
    if trainer.compile:
        raise ValueError("trainer.cuda_graphs=true and trainer.compile=true: choose one (graphs replay the eager "
                         "encoder's kernels; compile fuses them)")
    if trainer.diagnostics_every_n_steps:
        raise ValueError("trainer.cuda_graphs=true and trainer.diagnostics_every_n_steps: the diagnostics read each "
                         "layer's input through forward hooks, which a replayed graph does not call; set "
                         "trainer.diagnostics_every_n_steps=null or trainer.cuda_graphs=false")


class _Captured(nn.Module):
    """What make_graphed_callables is given: it takes a module (its parameters become the graph's
    inputs) and replaces that module's forward; this stand-in is replaced, the encoder is not."""

    def __init__(self, module: nn.Module, forward):
        super().__init__()
        self.module = module
        self._forward = forward

    def forward(self, *inputs: torch.Tensor):
        return self._forward(*inputs)


def _autocast_without_cache():
    """Autocast as it is, but without its weight-cast cache (make_graphed_callables refuses the cache)."""
    if torch.is_autocast_enabled("cuda"):
        return torch.autocast("cuda", dtype=torch.get_autocast_dtype("cuda"), cache_enabled=False)
    return nullcontext()


@contextmanager
def _input_validation_off():
    """attention_ext's input checks read flags on the host, which a capture may not do."""
    previous = set_input_validation(False)
    try:
        yield
    finally:
        set_input_validation(previous)


class GraphedForward:
    """Takes the place of `module.forward`: a training call (module in training mode, gradients on,
    CUDA inputs) replays the graph of its inputs' shape, captured on first sight; any other call runs
    the module's own forward."""

    def __init__(self, module: nn.Module, max_graphs: int = MAX_GRAPHS, forward=None, pool=None):
        self.module = module
        # `forward`: another method of the module to graph instead (the step benchmark's plain model's encode)
        self.eager_forward = forward if forward is not None else module.forward
        self.max_graphs = max_graphs
        self.graphs: dict[tuple, nn.Module] = {}
        # `pool`: a memory pool shared with other GraphedForwards whose steps never overlap with these
        # (the step benchmark's models, each trained in turn)
        self.pool = pool
        self._said_too_many = False

    def __call__(self, *inputs: torch.Tensor):
        if not (self.module.training and torch.is_grad_enabled() and self._on_gpu(inputs)):
            return self.eager_forward(*inputs)
        # the modules' identities too: a graph replays the attention it captured (set_attention swaps them)
        key = (tuple((x.shape, x.dtype, x.device, x.requires_grad) for x in inputs),
               torch.is_autocast_enabled("cuda"), torch.get_autocast_dtype("cuda"),
               tuple(map(id, self.module.modules())))
        graphed = self.graphs.get(key)
        if graphed is None:
            if len(self.graphs) >= self.max_graphs:
                if not self._said_too_many:
                    log.warning("cuda_graphs: more than %d batch shapes; new shapes run without a graph "
                                "(is data.fixed_batch_shapes on?)", self.max_graphs)
                    self._said_too_many = True
                return self.eager_forward(*inputs)
            graphed = self.graphs[key] = self._capture(inputs)
        with _autocast_without_cache():
            return graphed(*inputs)

    @staticmethod
    def _on_gpu(inputs: tuple[torch.Tensor, ...]) -> bool:
        return inputs[0].is_cuda

    def _capture(self, inputs: tuple[torch.Tensor, ...]) -> nn.Module:
        if self.pool is None:
            self.pool = torch.cuda.graph_pool_handle()
        sample = tuple(x.detach().clone().requires_grad_(x.requires_grad) for x in inputs)
        log.info("cuda_graphs: capturing the %s for batch shape %s (graph %d)", type(self.module).__name__,
                 [tuple(x.shape) for x in inputs], len(self.graphs) + 1)
        try:
            with torch.random.fork_rng(devices=[inputs[0].device]), _input_validation_off(), \
                    _autocast_without_cache():
                return torch.cuda.make_graphed_callables(_Captured(self.module, self.eager_forward), sample,
                                                         allow_unused_input=True, pool=self.pool)
        except RuntimeError as error:
            raise RuntimeError(f"trainer.cuda_graphs: the {type(self.module).__name__} could not be captured as "
                               f"a CUDA graph ({error}); train with trainer.cuda_graphs=false") from error


def graph_encoder(module: nn.Module, max_graphs: int = MAX_GRAPHS, pool=None) -> GraphedForward:
    """Makes `module`'s training forward+backward replay CUDA graphs (the module doc); its state dict
    keeps its keys. Returns the GraphedForward now serving as `module.forward`."""
    if isinstance(module.__dict__.get("forward"), GraphedForward):
        return module.__dict__["forward"]
    graphed = GraphedForward(module, max_graphs, pool=pool)
    module.forward = graphed
    return graphed

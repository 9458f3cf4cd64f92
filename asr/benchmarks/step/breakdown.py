"""Where one training step's time goes: torch.profiler's events grouped by stage.

Each stage of the forward is marked with a `record_function` range (forward hooks on the model's
modules, so neither model's code changes); a backward node carries the sequence number of the
forward operator that made it, so its time goes to that operator's stage, and within the attention
to that operator. Stages: data (the batch assembled from per-utterance tensors, what the training
process does when the loader has no workers), front end, attention (norm and projections; the
attention itself by operator), feed-forward (norm, linears, ReLU, dropout), CTC (heads, log-softmax,
loss), other forward work (feature normalisation, positions, residual sums, dropout, reshapes),
the backward engine's own time and gradient accumulation, and the optimiser (clipping, RAdam).
"""
from __future__ import annotations

import contextlib
import os
import sys
from collections import defaultdict
from dataclasses import dataclass, field

import torch
from torch.profiler import ProfilerActivity, profile, record_function

from asr.data.batching.dataset import pad_sequences
from asr.model.ctc import ctc_loss
from asr.benchmarks.step.workloads import OPTIM, PLAIN, TrainedModel, TrainingBatch

STAGE_PREFIX = "stage:"
DATA, FRONT_END, ATTENTION_PROJECTIONS, ATTENTION, FEED_FORWARD, CTC, OTHER, BACKWARD_ENGINE, OPTIMIZER = (
    "data (batch assembly)", "front end", "attention: norm + projections", "attention", "feed-forward", "CTC",
    "other forward (normalisation, positions, residuals, dropout)", "backward engine + grad accumulation",
    "optimiser (clip + RAdam)")
STAGES = (DATA, FRONT_END, ATTENTION_PROJECTIONS, ATTENTION, FEED_FORWARD, CTC, OTHER, BACKWARD_ENGINE, OPTIMIZER)


def _mark(module: torch.nn.Module, stage: str) -> list:
    """Marks every call of `module` as `stage` (forward hooks entering and leaving a record_function)."""
    ranges = []

    def enter(*_):
        ranges.append(record_function(STAGE_PREFIX + stage))
        ranges[-1].__enter__()

    def leave(*_):
        ranges.pop().__exit__(None, None, None)

    return [module.register_forward_pre_hook(enter), module.register_forward_hook(leave)]


def _mark_method(owner: torch.nn.Module, name: str, stage: str) -> None:
    method = getattr(owner, name)

    def marked(*args, **kwargs):
        with record_function(STAGE_PREFIX + stage):
            return method(*args, **kwargs)

    setattr(owner, name, marked)


def instrument(model: TrainedModel) -> None:
    """Marks the stages of a toolkit SpeechRecognizer or a PlainRecognizer (for the model's lifetime)."""
    module = model.module
    if model.label == PLAIN:
        _mark(module.frontend, FRONT_END)
        for layer in module.layers:
            _mark(layer.norm1, ATTENTION_PROJECTIONS)
            # nn.TransformerEncoderLayer's blocks: self_attn (projections and SDPA) + dropout, and
            # linear1, ReLU, dropout, linear2, dropout. Their projections show as operators of the attention.
            _mark_method(layer, "_sa_block", ATTENTION)
            _mark(layer.norm2, FEED_FORWARD)
            _mark_method(layer, "_ff_block", FEED_FORWARD)
        _mark_method(module, "ctc_log_probs", CTC)
    else:
        encoder = module.encoder
        _mark(encoder.frontend, FRONT_END)
        for layer in encoder.layers:
            for part in (layer.attention_norm, layer.query, layer.key, layer.value, layer.output):
                if part is not None:
                    _mark(part, ATTENTION_PROJECTIONS)
            _mark(layer.attention, ATTENTION)
            _mark(layer.ff_norm, FEED_FORWARD)
            _mark(layer.ff, FEED_FORWARD)
        _mark(module.heads, CTC)


def assemble_batch(batch: TrainingBatch) -> TrainingBatch:
    """The batch as the loader's collation makes it from per-utterance tensors (asr.data.batching.dataset)."""
    utterances = [f[:n] for f, n in zip(batch.features, batch.lengths.tolist())]
    targets = {kind: pad_sequences([t[:n] for t, n in zip(batch.targets[kind], batch.target_lengths[kind].tolist())])
               for kind in batch.targets}
    return TrainingBatch(pad_sequences(utterances), torch.tensor([len(u) for u in utterances]), targets,
                         {kind: n.clone() for kind, n in batch.target_lengths.items()}, batch.audio_seconds)


@dataclass
class StepBreakdown:
    """One profiled step: its wall time, and forward / backward milliseconds per stage and per
    operator of the attention (its backward under the forward operator that made it)."""
    step_ms: float = 0.0
    stages: dict[str, list[float]] = field(default_factory=lambda: defaultdict(lambda: [0.0, 0.0]))
    attention_operators: dict[str, list[float]] = field(default_factory=lambda: defaultdict(lambda: [0.0, 0.0]))


@contextlib.contextmanager
def profiler_notices_silenced():
    """Standard error closed to torch.profiler's C++ side: its Kineto library writes two lines to
    file descriptor 2 per profiled step ("USDT: ... profiler_start", "... profiler_stop"), which no
    setting turns off and which buried the tables. Writes through sys.stderr still reach the terminal."""
    sys.stderr.flush()
    saved = os.dup(2)
    try:
        with open(os.devnull, "w") as null:
            os.dup2(null.fileno(), 2)
        python_stderr = sys.stderr
        sys.stderr = os.fdopen(os.dup(saved), "w", buffering=1)
        try:
            yield
        finally:
            sys.stderr.flush()
            sys.stderr.close()
            sys.stderr = python_stderr
    finally:
        os.dup2(saved, 2)
        os.close(saved)


def profiled_step(model: TrainedModel, batch: TrainingBatch) -> StepBreakdown:
    """One training step (as TrainedModel.step, with the batch assembled first) under torch.profiler."""
    with profiler_notices_silenced(), profile(activities=[ProfilerActivity.CPU]) as prof:
        with record_function("step"):
            with record_function(STAGE_PREFIX + DATA):
                batch = assemble_batch(batch)
            model.optimizer.zero_grad(set_to_none=True)
            with record_function("forward"):
                log_probs, lengths = model.module(batch.features, batch.lengths)
                with record_function(STAGE_PREFIX + CTC):
                    loss = sum(model.loss_weights[kind] * ctc_loss(lp, lengths, batch.targets[kind],
                                                                     batch.target_lengths[kind])
                               for kind, lp in log_probs.items())
            with record_function("backward"):
                loss.backward()
            with record_function(STAGE_PREFIX + OPTIMIZER):
                torch.nn.utils.clip_grad_norm_(model.module.parameters(), OPTIM["clip_norm"])
                model.optimizer.step()
    return group_events(prof.events())


def _ms(event) -> float:
    return (event.time_range.end - event.time_range.start) / 1000.0


def _subtree(event):
    yield event
    for child in event.cpu_children:
        yield from _subtree(child)


def group_events(events) -> StepBreakdown:
    """The events of one profiled step (the range "step" holding the data stage, "forward",
    "backward" and the optimiser stage) grouped by stage. Forward stage ranges are the children of
    "forward"; what "forward" holds outside them is OTHER. A backward node goes to the stage (and
    attention operator) of the forward operator with its sequence number; the backward's remaining
    time (gradient accumulation, the engine) is BACKWARD_ENGINE."""
    result = StepBreakdown()
    # forward sequence number -> (stage, attention operator). An operator records the autograd
    # sequence number current when it starts, so one that makes no backward node shares it with the
    # next one that does: in start order, the last operator with a number is the one that made its node.
    origin: dict[int, tuple[str, str | None]] = {}
    for root in (e for e in events if e.cpu_parent is None and e.name == "step"):
        result.step_ms += _ms(root)
        for part in root.cpu_children:
            if part.name == "forward":
                staged = 0.0
                for child in part.cpu_children:
                    if not child.name.startswith(STAGE_PREFIX):
                        for event in _subtree(child):
                            origin[event.sequence_nr] = (OTHER, None)
                        continue
                    stage = child.name[len(STAGE_PREFIX):]
                    result.stages[stage][0] += _ms(child)
                    staged += _ms(child)
                    for operator in child.cpu_children:
                        name = operator.name if stage == ATTENTION else None
                        if name is not None:
                            result.attention_operators[name][0] += _ms(operator)
                        for event in _subtree(operator):
                            origin[event.sequence_nr] = (stage, name)
                result.stages[OTHER][0] += _ms(part) - staged
            elif part.name == "backward":
                accounted = 0.0
                for node in part.cpu_children:
                    if node.sequence_nr < 0 or node.sequence_nr not in origin:
                        continue
                    stage, operator = origin[node.sequence_nr]
                    result.stages[stage][1] += _ms(node)
                    if operator is not None:
                        result.attention_operators[operator][1] += _ms(node)
                    accounted += _ms(node)
                result.stages[BACKWARD_ENGINE][1] += _ms(part) - accounted
            elif part.name.startswith(STAGE_PREFIX):
                result.stages[part.name[len(STAGE_PREFIX):]][0] += _ms(part)
            else:
                result.stages[OTHER][0] += _ms(part)     # zero_grad's
    return result


def fastest_breakdown(steps: list[StepBreakdown]) -> StepBreakdown:
    """Entry by entry, the minimum over profiled steps: on a machine shared with other jobs a stage
    can only be slowed down by them (waiting for a core counts in wall-clock ranges), so the least
    time each stage took is the best estimate of its own cost. The stages' minima need not add up
    to the fastest step."""
    result = StepBreakdown(step_ms=min(s.step_ms for s in steps))
    for attribute in ("stages", "attention_operators"):
        names = {name for s in steps for name in getattr(s, attribute)}
        for name in names:
            for side in (0, 1):
                getattr(result, attribute)[name][side] = min(
                    getattr(s, attribute).get(name, [0.0, 0.0])[side] for s in steps)
    return result

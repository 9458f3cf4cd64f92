"""Training steps timed side by side: every model takes the same batches in turn, repeat by repeat."""
from __future__ import annotations

import statistics
import time
from dataclasses import dataclass, field

import torch

from asr.benchmarks.step.modes import apply_mode
from asr.benchmarks.step.workloads import PLAIN, TrainedModel, Workload, build_model, make_batch, parameter_count


@dataclass
class StepTimes:
    workload: Workload
    label: str
    parameters: int
    audio_seconds: float                 # per batch (the mean over the batches used)
    encoder_positions: float             # mean valid encoder positions per utterance
    seconds: list[float] = field(default_factory=list)        # wall clock per step
    cpu_seconds: list[float] = field(default_factory=list)    # this process's CPU time per step, all threads
    mode: str = "eager"                  # asr.benchmarks.step.modes.MODES
    error: str | None = None             # why the model stopped (out of memory, a failed capture), if it did

    @property
    def ok(self) -> bool:
        return self.error is None and bool(self.seconds)

    @property
    def median(self) -> float:
        return statistics.median(self.seconds)

    @property
    def cpu_median(self) -> float:
        """On a machine shared with other jobs the wall clock also counts the time this process
        waited for a core; its CPU time does not (but counts OpenMP threads spinning at barriers)."""
        return statistics.median(self.cpu_seconds)

    @property
    def audio_per_second(self) -> float:
        """Utterance-seconds of audio trained on per wall-clock second."""
        return self.audio_seconds / self.median


def time_workload(workload: Workload, labels: list[str], repeats: int, warmup: int,
                  progress=lambda text: None, mode: str = "eager", device: str = "cpu",
                  precision: str = "32-true") -> list[StepTimes]:
    """Builds every model (all from one seed, its encoder run in `mode`: asr.benchmarks.step.modes),
    then runs warmup + repeats rounds; in round r every model trains on batch r, in an order rotated
    by one each round (so no model always follows the same one). Returns one StepTimes per label
    with the timed rounds' seconds. A model that fails (out of memory, a capture that fails) gets
    its error and leaves the rounds; the others go on."""
    pool = torch.cuda.graph_pool_handle() if mode == "graphed" else None
    models: list[TrainedModel] = []
    for label in labels:
        torch.manual_seed(0)
        model = build_model(workload, label, device, precision)
        apply_mode(model, mode, pool)
        models.append(model)
    batches = [make_batch(workload, seed) for seed in range(warmup + repeats)]
    positions = float(torch.stack([_encoder_lengths(models, b.lengths) for b in batches]).float().mean())
    results = [StepTimes(workload, m.label, parameter_count(m.module),
                         sum(b.audio_seconds for b in batches) / len(batches), positions, mode=mode) for m in models]
    for round_index, batch in enumerate(batches):
        batch = batch.to(device)
        order = list(range(len(models)))
        order = order[round_index % len(order):] + order[:round_index % len(order)]
        for i in (i for i in order if results[i].error is None):
            try:
                elapsed, cpu_elapsed = _timed_step(models[i], batch, device)
            except (RuntimeError, torch.OutOfMemoryError) as error:   # this model's cell says so; the rest go on
                results[i].error = f"{type(error).__name__}: {str(error).splitlines()[0][:200]}"
                _release(models, i, device)
                continue
            if round_index >= warmup:
                results[i].seconds.append(elapsed)
                results[i].cpu_seconds.append(cpu_elapsed)
        progress(f"{workload.name} {mode}: round {round_index + 1}/{len(batches)}")
    return results


def _timed_step(model: TrainedModel, batch, device: str) -> tuple[float, float]:
    """Wall clock and CPU seconds of one step, the GPU's queue drained before and after."""
    if device == "cuda":
        torch.cuda.synchronize()
    start, cpu_start = time.perf_counter(), time.process_time()
    model.step(batch)
    if device == "cuda":
        torch.cuda.synchronize()
    return time.perf_counter() - start, time.process_time() - cpu_start


def _release(models: list[TrainedModel], index: int, device: str) -> None:
    """Frees a failed model's memory for the others (its gradients and optimiser state)."""
    models[index].optimizer.zero_grad(set_to_none=True)
    models[index].optimizer.state.clear()
    if device == "cuda":
        torch.cuda.empty_cache()


def _encoder_lengths(models: list[TrainedModel], lengths: torch.Tensor) -> torch.Tensor:
    """Encoder positions of each utterance (after subsampling), from any toolkit model's front end."""
    for model in models:
        if model.label != PLAIN:
            return model.module.encoder.output_lengths(lengths)
    return model.module.frontend.output_lengths(lengths)

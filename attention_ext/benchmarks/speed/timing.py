"""The measured passes: random inputs, one forward (+backward), interleaved rounds over all cells."""
from __future__ import annotations

import sys
import time
from dataclasses import dataclass
from typing import Callable

import torch

from .cases import BenchmarkCase, BenchmarkConfig, Measurement, add_ratios_to_full, build_cases, sdpa_context
from .memory import peak_memory_bytes


@dataclass
class Inputs:
    q: torch.Tensor
    k: torch.Tensor
    v: torch.Tensor
    grad_out: torch.Tensor


def make_inputs(config: BenchmarkConfig, length: int) -> Inputs:
    """Random q, k, v (leaves that require grad) and a random output gradient.

    Drawn on the CPU from a generator seeded by (seed, N), so every device and
    every run sees the same numbers.
    """
    generator = torch.Generator().manual_seed(config.seed * 1_000_003 + length)
    shape = (config.batch, config.heads, length, config.dim)

    def draw():
        return torch.randn(shape, generator=generator).to(config.device, config.dtype)

    q, k, v, grad_out = draw(), draw(), draw(), draw()
    for tensor in (q, k, v):
        tensor.requires_grad_(True)
    return Inputs(q, k, v, grad_out)


def clear_gradients(inputs: Inputs) -> None:
    """Frees the last pass's gradients, outside the measured region, so every pass
    allocates its gradients afresh (counted in time and memory) and frees nothing old."""
    for tensor in (inputs.q, inputs.k, inputs.v):
        tensor.grad = None


def forward_backward(case: BenchmarkCase, inputs: Inputs) -> None:
    """One forward+backward, the measured region."""
    keys = inputs.q if case.shared_qk else inputs.k
    with sdpa_context(case):
        out = case.module(inputs.q, keys, inputs.v)
        out.backward(inputs.grad_out)


def forward_only(case: BenchmarkCase, inputs: Inputs) -> None:
    """One forward under torch.no_grad (nothing kept for a backward, as at inference)."""
    keys = inputs.q if case.shared_qk else inputs.k
    with sdpa_context(case), torch.no_grad():
        case.module(inputs.q, keys, inputs.v)


def measured_pass(config: BenchmarkConfig) -> Callable[[BenchmarkCase, Inputs], None]:
    """The pass a run measures: forward_backward, or forward_only when config.backward is False."""
    return forward_backward if config.backward else forward_only


def _synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def time_pass_ms(case: BenchmarkCase, inputs: Inputs, device: torch.device,
                 run: Callable[[BenchmarkCase, Inputs], None] = forward_backward) -> float:
    clear_gradients(inputs)
    _synchronize(device)
    start = time.perf_counter()
    run(case, inputs)
    _synchronize(device)
    return (time.perf_counter() - start) * 1e3


def estimated_pass_seconds(seconds_by_length: dict[int, float], length: int) -> tuple[float, int] | None:
    """(estimated seconds of one pass at `length`, the length it is estimated from): the pass at the
    longest shorter length measured, scaled by (length / that length)^2: exact attention's growth,
    the fastest of any attention here, so for the others the estimate is an upper bound. None
    without a shorter length measured."""
    shorter = [measured for measured in seconds_by_length if measured < length]
    if not shorter:
        return None
    basis = max(shorter)
    return seconds_by_length[basis] * (length / basis) ** 2, basis


def _is_out_of_memory(error: BaseException) -> bool:
    """CUDA's OutOfMemoryError, or the CPU allocator's refusal (a RuntimeError)."""
    return (isinstance(error, (torch.OutOfMemoryError, MemoryError))
            or (isinstance(error, RuntimeError) and "can't allocate memory" in str(error)))


class Progress:
    """A tqdm bar on a terminal, plus one line per finished measurement on stderr."""

    def __init__(self, total: int):
        from tqdm import tqdm
        self.bar = tqdm(total=total, unit="pass", file=sys.stderr, disable=None, leave=False)

    def step(self, description: str) -> None:
        self.bar.set_description(description, refresh=False)
        self.bar.update(1)

    def line(self, text: str) -> None:
        self.bar.write(text, file=sys.stderr)

    def close(self) -> None:
        self.bar.close()


class BenchmarkRounds:
    """The (N, attention) cells of one benchmark and the rounds over them. Each round visits every
    cell, every length and every attention; a pass that runs out of memory retires its attention at
    that length and every larger one. With a time budget (config.time_budget_s), a cell whose first
    pass is estimated (estimated_pass_seconds, from the same attention's latest pass at a shorter
    length) to take longer than the budget is skipped, and its attention with it at every larger
    length (exact attention, whose time grows as N^2, at the long table's longest N)."""

    def __init__(self, config: BenchmarkConfig, cases: list[BenchmarkCase], progress: Progress):
        self.config, self.cases, self.progress = config, cases, progress
        self.run_pass = measured_pass(config)
        # per attention label: seconds of its latest recorded pass at each length (warm-up, timed, memory)
        self.pass_seconds: dict[str, dict[int, float]] = {case.label: {} for case in cases}
        self.cells = {(length, case.label): Measurement(length, case)
                      for length in config.lengths for case in cases}
        self.active: dict[int, list[BenchmarkCase]] = {}
        for length in config.lengths:
            self.active[length] = []
            for case in cases:
                if case.max_length is not None and length > case.max_length:
                    self.cells[length, case.label].status = f"skipped (--max-length {case.max_length})"
                else:
                    self.active[length].append(case)
        self.inputs = {length: make_inputs(config, length) for length in config.lengths if self.active[length]}

    def each_cell(self):
        for length in self.config.lengths:
            for case in self.cases:
                yield length, case

    def attempt(self, length: int, case: BenchmarkCase, description: str,
                work: Callable[[Inputs], object], record: bool = True):
        """Runs one pass of `case` at `length`; out of memory retires it there and above. `record`:
        whether its seconds may estimate longer lengths' (not a first call's, see warm_up)."""
        self.progress.step(f"N={length} {case.label} {description}")
        if case not in self.active[length] or self._over_budget(length, case):
            return None
        clear_gradients(self.inputs[length])
        try:
            start = time.perf_counter()
            result = work(self.inputs[length])
            if record:
                self.pass_seconds[case.label][length] = time.perf_counter() - start
            return result
        except Exception as error:
            if not _is_out_of_memory(error):
                if hasattr(error, "add_note"):  # Python >= 3.11
                    error.add_note(f"while benchmarking {case.label} = "
                                   f"{case.name}({case.options_text}) at N={length}")
                raise
            self._retire(length, case)
            return None

    def _over_budget(self, length: int, case: BenchmarkCase) -> bool:
        """Before the first pass of a cell: whether its estimate exceeds the time budget (then the
        cell and its attention's larger lengths are retired, saying why)."""
        budget, measured = self.config.time_budget_s, self.pass_seconds[case.label]
        if budget is None or length in measured:
            return False
        estimate = estimated_pass_seconds(measured, length)
        if estimate is None or estimate[0] <= budget:
            return False
        seconds, basis = estimate
        reason = (f"skipped (estimated {seconds:.3g} s per pass > time budget {budget:g} s: "
                  f"{measured[basis]:.3g} s at N={basis} x (N/{basis})^2)")
        self._retire(length, case, reason, f"skipped (over the time budget at N={length})")
        return True

    def _retire(self, length: int, case: BenchmarkCase, status: str = "out of memory",
                status_above: str | None = None) -> None:
        for larger in self.config.lengths:
            if larger >= length and case in self.active[larger]:
                self.active[larger].remove(case)
                self.cells[larger, case.label].status = (
                    status if larger == length
                    else status_above or f"skipped (out of memory at N={length})")
        self.progress.line(f"N={length:>6} {case.label}: {status}")
        if self.config.device.type == "cuda":
            torch.cuda.empty_cache()

    def warm_up(self) -> None:
        if self.config.time_budget_s is not None:
            # A first call may compile (Triton) or set up libraries: not a pass to estimate from.
            for case in self.cases:
                shortest = min((length for length in self.config.lengths if case in self.active[length]),
                               default=min(self.config.lengths))
                self.attempt(shortest, case, "first call", lambda x: self.run_pass(case, x), record=False)
        for index in range(self.config.warmup):
            for length, case in self.each_cell():
                self.attempt(length, case, f"warm-up {index + 1}/{self.config.warmup}",
                             lambda x: self.run_pass(case, x))

    def time_repeats(self) -> None:
        for index in range(self.config.repeats):
            for length, case in self.each_cell():
                elapsed = self.attempt(length, case, f"repeat {index + 1}/{self.config.repeats}",
                                       lambda x: time_pass_ms(case, x, self.config.device, self.run_pass))
                if elapsed is not None:
                    self.cells[length, case.label].times_ms.append(elapsed)

    def measure_memory(self) -> None:
        for length, case in self.each_cell():
            cell = self.cells[length, case.label]
            peak = self.attempt(length, case, "memory", lambda x: peak_memory_bytes(
                lambda: self.run_pass(case, x), self.config.device))
            if peak is not None:
                cell.peak_bytes = peak
            if cell.status == "ok" and cell.median_ms is not None:
                self.progress.line(f"N={length:>6} {case.label}: {cell.median_ms:.2f} ms (median of "
                                   f"{len(cell.times_ms)}), peak {cell.peak_memory_mib():.2f} MiB")


def run_benchmark(config: BenchmarkConfig, cases: list[BenchmarkCase] | None = None
                  ) -> list[Measurement]:
    """Measures every (N, attention) cell. Each warm-up and each repeat is one round over
    all cells, every length and every attention, so a slow spell of a shared machine
    lands on all cells alike and the ratios (between attentions and between lengths)
    compare passes taken side by side."""
    torch.manual_seed(config.seed)
    if config.device.type == "cpu":
        torch.set_num_threads(config.threads)
    cases = build_cases(config) if cases is None else cases
    passes_per_case = config.warmup + config.repeats + 1
    first_calls = len(cases) if config.time_budget_s is not None else 0
    progress = Progress(total=len(config.lengths) * len(cases) * passes_per_case + first_calls)
    rounds = BenchmarkRounds(config, cases, progress)
    try:
        rounds.warm_up()
        rounds.time_repeats()
        rounds.measure_memory()
    finally:
        progress.close()
    measurements = list(rounds.cells.values())
    add_ratios_to_full(measurements)
    return measurements

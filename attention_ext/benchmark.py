"""Time and memory of one attention forward+backward pass per sequence element.

    python -m attention_ext.benchmark                      # the issue's defaults (see --help)
    python -m attention_ext.benchmark --lengths 1024 4096 --attentions full lsh-1 i-clustered-100

Like supplementary C.1 / Fig. 4 of "Fast Transformers with Clustered Attention":
random queries, keys and values of shape (batch, heads, N, dim), one
forward+backward through each attention, reported per sequence element
(divided by batch * N). Every attention in the registry can be benchmarked by
its spec (`parse_attention_spec`); an attention registered with needs_shared_qk
(lsh, shared_full) gets k = q (the same tensor).

All cells (every N, every attention) are measured in the same run, interleaved
repeat by repeat: each repeat is one round over all of them. So the speedup
ratios against full and the per-element ratios between lengths compare numbers
taken under the same machine load. Timing and memory are separate passes: the memory
pass runs under the profiler (CPU), which would distort timings.

Peak memory is the peak of tensor memory allocated by PyTorch's allocator during
the forward+backward, above what was live before it (inputs excluded, gradients
and everything kept for backward included). On CUDA this is
torch.cuda.max_memory_allocated. On CPU there is no such counter, so
`cpu_peak_memory_bytes` reads the allocation events of torch.profiler
(profile_memory=True), which carry the allocator's running total of live bytes.
Memory a kernel takes outside PyTorch's allocator (malloc, std::vector, a BLAS
library's scratch) is not counted on either device.
"""
from __future__ import annotations

import argparse
import contextlib
import csv
import os
import statistics
import sys
import tempfile
import textwrap
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import torch

from .registry import AttentionConfigError, accepted_spec_forms, available_attentions, parse_attention_spec

DEFAULT_LENGTHS = (512, 1024, 2048, 4096, 8192)
# On a GPU the lengths where the linear attentions are meant to overtake SDPA (clustered
# at N <= 8192, i-clustered at N <= 16384 in bfloat16) and beyond.
DEFAULT_CUDA_LENGTHS = (1024, 2048, 4096, 8192, 16384, 32768, 65536)
# C.1: clustered with 100 clusters, 63 bits, 10 Lloyd iterations; i-clustered the
# same with k = 32; Reformer with 1 and 4 hashing rounds (those are the registry's
# defaults, so the short specs suffice; the run header prints the full options).
DEFAULT_ATTENTIONS = ("full", "clustered-100", "i-clustered-100", "lsh-1", "lsh-4")

CSV_COLUMNS = (
    "length", "attention", "name", "options", "status", "batch", "heads", "dim", "dtype",
    "device", "threads", "repeats", "median_ms", "time_per_element_us", "peak_memory_bytes",
    "peak_memory_mib", "memory_per_element_kib", "speedup_vs_full", "memory_saving_vs_full",
)
MIB = 2 ** 20
KIB = 2 ** 10


# ---------------------------------------------------------------------------
# Peak memory


@contextlib.contextmanager
def _kineto_banner_filtered():
    """Drops the 'profiler_start/stop' lines Kineto writes straight to fd 2.

    They would interleave with the progress lines once per measurement; any
    other output written meanwhile is passed through unchanged.
    """
    sys.stderr.flush()
    saved = os.dup(2)
    with tempfile.TemporaryFile(mode="w+b") as captured:
        os.dup2(captured.fileno(), 2)
        try:
            yield
        finally:
            sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)
            captured.seek(0)
            for line in captured.read().decode(errors="replace").splitlines(keepends=True):
                if "ActivityProfiler" not in line:
                    sys.stderr.write(line)
            sys.stderr.flush()


def cpu_peak_memory_bytes(fn: Callable[[], object]) -> int:
    """Peak bytes of CPU tensor memory live during `fn()`, above the level before it.

    Method: run `fn` under torch.profiler with profile_memory=True. Every
    allocation and free through PyTorch's CPU allocator is recorded with the
    allocator's running total of live bytes, updated under the allocator's lock,
    so the totals are in true chronological order whatever the timestamps. A
    4-byte marker tensor allocated just before `fn` fixes the level before it
    (its event's total minus its own size); the peak is the largest total after
    that, minus that level. Tensors freed by `fn` that were allocated before it
    lower the level, as they really do.

    Not seen: memory taken outside PyTorch's allocator, and tensors allocated on
    threads the profiler does not follow (OpenMP workers inside at::parallel_for;
    the calling thread and autograd's threads are followed).
    """
    from torch._C._profiler import _EventType
    from torch.profiler import ProfilerActivity, profile

    profiler = profile(activities=[ProfilerActivity.CPU], profile_memory=True)
    with _kineto_banner_filtered():
        profiler.start()
    try:
        marker = torch.empty(1, dtype=torch.float32)
        marker_address, marker_bytes = marker.data_ptr(), marker.element_size()
        del marker
        fn()
    finally:
        with _kineto_banner_filtered():
            profiler.stop()

    allocations = []  # (time ns, bytes (+ allocated, - freed), allocator total after it, address)
    stack = list(profiler.profiler.kineto_results.experimental_event_tree())
    while stack:
        node = stack.pop()
        if node.tag == _EventType.Allocation:
            event = node.extra_fields
            if event.device.type == "cpu":
                allocations.append((node.start_time_ns, event.alloc_size, event.total_allocated,
                                    event.ptr))
        stack.extend(node.children)
    allocations.sort(key=lambda allocation: allocation[0])
    marker_index = next((index for index, (_, size, _, address) in enumerate(allocations)
                         if address == marker_address and size == marker_bytes), None)
    if marker_index is None:
        raise RuntimeError(
            "torch.profiler recorded no CPU allocation events; CPU peak memory cannot be "
            f"measured with this torch ({torch.__version__})")
    _, size, total, _ = allocations[marker_index]
    level_before = total - size
    peak = max(total for _, _, total, _ in allocations[marker_index:])
    return max(0, peak - level_before)


def cuda_peak_memory_bytes(fn: Callable[[], object], device: torch.device) -> int:
    """Peak bytes of CUDA tensor memory live during `fn()`, above the level before it."""
    torch.cuda.synchronize(device)
    torch.cuda.reset_peak_memory_stats(device)
    level_before = torch.cuda.memory_allocated(device)
    fn()
    torch.cuda.synchronize(device)
    return max(0, torch.cuda.max_memory_allocated(device) - level_before)


def peak_memory_bytes(fn: Callable[[], object], device: torch.device) -> int:
    """Peak tensor memory of `fn()` above the level before it, on `device`'s type."""
    if device.type == "cuda":
        return cuda_peak_memory_bytes(fn, device)
    if device.type == "cpu":
        return cpu_peak_memory_bytes(fn)
    raise ValueError(f"peak memory is measured on cpu and cuda only, not {device}")


# ---------------------------------------------------------------------------
# One benchmark case: an attention spec and how to call it


@dataclass
class BenchmarkCase:
    """An attention as the user wrote it (label), built once and reused for every N."""
    label: str
    name: str
    options: dict[str, int]
    module: torch.nn.Module
    shared_qk: bool                 # called with k = q (registered with needs_shared_qk)
    max_length: int | None = None

    @property
    def options_text(self) -> str:
        return " ".join(f"{key}={value}" for key, value in self.options.items())


@dataclass
class Inputs:
    q: torch.Tensor
    k: torch.Tensor
    v: torch.Tensor
    grad_out: torch.Tensor


@dataclass
class Measurement:
    """One (N, attention) cell. Numbers are None unless status is 'ok'."""
    length: int
    case: BenchmarkCase
    status: str = "ok"
    times_ms: list[float] = field(default_factory=list)
    peak_bytes: int | None = None
    speedup_vs_full: float | None = None
    memory_saving_vs_full: float | None = None

    @property
    def median_ms(self) -> float | None:
        return statistics.median(self.times_ms) if self.status == "ok" and self.times_ms else None

    def time_per_element_us(self, batch: int) -> float | None:
        median = self.median_ms
        return None if median is None else median * 1e3 / (batch * self.length)

    def peak_memory_mib(self) -> float | None:
        return None if self.peak_bytes is None else self.peak_bytes / MIB

    def memory_per_element_kib(self, batch: int) -> float | None:
        return None if self.peak_bytes is None else self.peak_bytes / KIB / (batch * self.length)


@dataclass
class BenchmarkConfig:
    lengths: list[int]
    attentions: list[str]
    batch: int = 1
    heads: int = 6
    dim: int = 64
    dtype: torch.dtype = torch.float32
    device: torch.device = torch.device("cpu")
    threads: int = 2
    warmup: int = 1
    repeats: int = 5
    seed: int = 0
    max_lengths: dict[str, int] = field(default_factory=dict)


def build_cases(config: BenchmarkConfig) -> list[BenchmarkCase]:
    """Parses and builds every attention spec; a bad spec fails here, before any timing."""
    cases, seen = [], set()
    for spec in config.attentions:
        label = spec.strip()
        if label in seen:
            raise AttentionConfigError(f"attention {label!r} is listed twice in --attentions")
        seen.add(label)
        attention = parse_attention_spec(label)
        cases.append(BenchmarkCase(label, attention.name, attention.options,
                                   attention.build().to(config.device), attention.needs_shared_qk))
    by_label = {case.label: case for case in cases}
    for key, limit in config.max_lengths.items():
        matched = [case for case in cases if key in (case.label, case.name)]
        if not matched:
            raise AttentionConfigError(
                f"--max-length {key}={limit}: {key!r} is none of the benchmarked attentions "
                f"({', '.join(by_label)}); give a spec from --attentions or a registered name")
        for case in matched:
            case.max_length = limit
    return cases


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
    out = case.module(inputs.q, keys, inputs.v)
    out.backward(inputs.grad_out)


def _synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def time_forward_backward_ms(case: BenchmarkCase, inputs: Inputs, device: torch.device) -> float:
    clear_gradients(inputs)
    _synchronize(device)
    start = time.perf_counter()
    forward_backward(case, inputs)
    _synchronize(device)
    return (time.perf_counter() - start) * 1e3


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
    progress = Progress(total=len(config.lengths) * len(cases) * passes_per_case)
    cells = {(length, case.label): Measurement(length, case)
             for length in config.lengths for case in cases}
    active: dict[int, list[BenchmarkCase]] = {}
    for length in config.lengths:
        active[length] = []
        for case in cases:
            if case.max_length is not None and length > case.max_length:
                cells[length, case.label].status = f"skipped (--max-length {case.max_length})"
            else:
                active[length].append(case)
    inputs = {length: make_inputs(config, length) for length in config.lengths if active[length]}

    def attempt(length: int, case: BenchmarkCase, description: str,
                work: Callable[[Inputs], object]):
        """Runs one pass of `case` at `length`; out of memory retires it there and above."""
        progress.step(f"N={length} {case.label} {description}")
        if case not in active[length]:
            return None
        clear_gradients(inputs[length])
        try:
            return work(inputs[length])
        except Exception as error:
            if not _is_out_of_memory(error):
                if hasattr(error, "add_note"):  # Python >= 3.11
                    error.add_note(f"while benchmarking {case.label} = "
                                   f"{case.name}({case.options_text}) at N={length}")
                raise
            for larger in config.lengths:
                if larger >= length and case in active[larger]:
                    active[larger].remove(case)
                    cells[larger, case.label].status = (
                        "out of memory" if larger == length
                        else f"skipped (out of memory at N={length})")
            progress.line(f"N={length:>6} {case.label}: out of memory")
            if config.device.type == "cuda":
                torch.cuda.empty_cache()
            return None

    def each_cell():
        for length in config.lengths:
            for case in cases:
                yield length, case

    try:
        for index in range(config.warmup):
            for length, case in each_cell():
                attempt(length, case, f"warm-up {index + 1}/{config.warmup}",
                        lambda x: forward_backward(case, x))
        for index in range(config.repeats):
            for length, case in each_cell():
                elapsed = attempt(length, case, f"repeat {index + 1}/{config.repeats}",
                                  lambda x: time_forward_backward_ms(case, x, config.device))
                if elapsed is not None:
                    cells[length, case.label].times_ms.append(elapsed)
        for length, case in each_cell():
            cell = cells[length, case.label]
            peak = attempt(length, case, "memory", lambda x: peak_memory_bytes(
                lambda: forward_backward(case, x), config.device))
            if peak is not None:
                cell.peak_bytes = peak
            if cell.status == "ok" and cell.median_ms is not None:
                progress.line(f"N={length:>6} {case.label}: {cell.median_ms:.2f} ms (median of "
                              f"{len(cell.times_ms)}), peak {cell.peak_memory_mib():.2f} MiB")
    finally:
        progress.close()
    measurements = list(cells.values())
    add_ratios_to_full(measurements)
    return measurements


def add_ratios_to_full(measurements: list[Measurement]) -> None:
    """speedup_vs_full = full median time / time; memory_saving_vs_full = full peak / peak.

    Both > 1 mean better than full. They use the `full` row of the same N (the
    first case named full), so they exist only where full was measured too.
    """
    full_by_length: dict[int, Measurement] = {}
    for cell in measurements:
        if cell.case.name == "full" and cell.length not in full_by_length:
            full_by_length[cell.length] = cell
    for cell in measurements:
        full = full_by_length.get(cell.length)
        if full is None or cell.median_ms is None:
            continue
        if full.median_ms is not None and cell.median_ms > 0:
            cell.speedup_vs_full = full.median_ms / cell.median_ms
        if full.peak_bytes is not None and cell.peak_bytes:
            cell.memory_saving_vs_full = full.peak_bytes / cell.peak_bytes


# ---------------------------------------------------------------------------
# Where an attention overtakes full


def overtaking_lengths(measurements: list[Measurement]) -> dict[str, int | None]:
    """For every attention but full: the shortest measured N from which it is faster than
    full (speedup > 1) at that N and at every longer N where both were measured; None if it
    is not faster at the longest such N. Attentions never compared with full are left out.
    """
    ratios: dict[str, dict[int, float]] = {}
    for cell in measurements:
        if cell.case.name != "full" and cell.speedup_vs_full is not None:
            ratios.setdefault(cell.case.label, {})[cell.length] = cell.speedup_vs_full
    overtakes = {}
    for label, by_length in ratios.items():
        overtakes[label] = None
        for length in sorted(by_length, reverse=True):
            if by_length[length] <= 1:
                break
            overtakes[label] = length
    return overtakes


def _overtaking_text(length: int | None) -> str:
    return "not faster at the longest N measured" if length is None else f"from N={length}"


def format_overtaking(overtakes: dict[str, int | None]) -> str:
    lines = ["where each attention overtakes full (faster at that N and at every longer N measured):"]
    if not overtakes:
        lines.append("  no attention was compared with full")
    for label, length in overtakes.items():
        lines.append(f"  {label}: {_overtaking_text(length)}")
    return "\n".join(lines)


# ---------------------------------------------------------------------------
# Targets of the issues, evaluated on the ratios of this run


@dataclass(frozen=True)
class SpeedupTarget:
    name: str
    options: tuple[tuple[str, int], ...]   # options a case must have for the target to apply
    length: int
    minimum: float
    title: str


@dataclass(frozen=True)
class LinearScalingTarget:
    name: str
    options: tuple[tuple[str, int], ...]
    shortest: int
    longest: int
    factor: float
    title: str


@dataclass(frozen=True)
class OvertakingTarget:
    name: str
    options: tuple[tuple[str, int], ...]
    length: int        # the attention must overtake full at this N or a shorter one
    title: str


SPEEDUP_TARGETS = (
    SpeedupTarget("clustered", (), 4096, 12.0, "clustered"),
    SpeedupTarget("clustered", (), 8192, 20.0, "clustered"),
    SpeedupTarget("iclustered", (), 4096, 7.0, "iclustered"),
    SpeedupTarget("iclustered", (), 8192, 12.0, "iclustered"),
    SpeedupTarget("lsh", (("rounds", 1),), 4096, 10.0, "lsh-1"),
    SpeedupTarget("lsh", (("rounds", 4),), 4096, 3.0, "lsh-4"),
)
LINEAR_SCALING_TARGETS = tuple(
    LinearScalingTarget(name, options, 2048, 8192, 1.3, title)
    for name, options, title in (("clustered", (), "clustered"), ("iclustered", (), "iclustered"),
                                 ("lsh", (("rounds", 1),), "lsh-1"),
                                 ("lsh", (("rounds", 4),), "lsh-4")))
OVERTAKING_TARGETS = (
    OvertakingTarget("clustered", (), 8192, "clustered"),
    OvertakingTarget("iclustered", (), 16384, "iclustered"),
)
# (speedup, linear scaling, overtaking) targets by (device, dtype) of the run: on the CPU in
# float32 against torch's CPU attention (issue 2), on CUDA in bfloat16 against SDPA's
# FlashAttention kernels (issue 6). Other runs have none.
TARGETS_BY_RUN = {
    ("cpu", torch.float32): (SPEEDUP_TARGETS, LINEAR_SCALING_TARGETS, ()),
    ("cuda", torch.bfloat16): ((), (), OVERTAKING_TARGETS),
}


def _applies(case: BenchmarkCase, name: str, options: tuple[tuple[str, int], ...]) -> bool:
    return case.name == name and all(case.options.get(key) == value for key, value in options)


@dataclass
class TargetResult:
    passed: bool
    text: str


def evaluate_targets(measurements: list[Measurement], batch: int, device_type: str,
                     dtype: torch.dtype) -> list[TargetResult]:
    """The issues' targets of this run's device and dtype, for every measured case they apply to.

    Speedup: full time / time at N, from this run. Linear scaling: time per
    element at every measured N in [2048, 8192] (both ends measured), largest
    over smallest <= 1.3, i.e. all those values lie within 1.3x of each other.
    Overtaking: faster than full at N (measured) and at every longer N measured.
    A target whose attention or lengths were not measured is left out.
    """
    speedup_targets, scaling_targets, overtaking_targets = TARGETS_BY_RUN.get((device_type, dtype),
                                                                              ((), (), ()))
    results = []
    cases = list(dict.fromkeys(cell.case.label for cell in measurements))
    cells = {(cell.case.label, cell.length): cell for cell in measurements}
    case_by_label = {cell.case.label: cell.case for cell in measurements}
    for target in speedup_targets:
        for label in cases:
            if not _applies(case_by_label[label], target.name, target.options):
                continue
            cell = cells.get((label, target.length))
            if cell is None or cell.speedup_vs_full is None:
                continue
            passed = cell.speedup_vs_full >= target.minimum
            results.append(TargetResult(passed, (
                f"{label}: speedup vs full at N={target.length} >= {target.minimum:g}x "
                f"(target for {target.title}): {cell.speedup_vs_full:.2f}x")))
    for target in scaling_targets:
        for label in cases:
            if not _applies(case_by_label[label], target.name, target.options):
                continue
            per_element = {length: cell.time_per_element_us(batch)
                           for (cell_label, length), cell in cells.items()
                           if cell_label == label and target.shortest <= length <= target.longest
                           and cell.median_ms is not None}
            if target.shortest not in per_element or target.longest not in per_element:
                continue
            spread = max(per_element.values()) / min(per_element.values())
            values = ", ".join(f"N={length}: {value:.3g} us"
                               for length, value in sorted(per_element.items()))
            results.append(TargetResult(spread <= target.factor, (
                f"{label}: time per element within {target.factor:g}x over "
                f"N={target.shortest}..{target.longest} (target for {target.title}): "
                f"max/min = {spread:.2f} ({values})")))
    overtakes = overtaking_lengths(measurements)
    for target in overtaking_targets:
        for label in cases:
            cell = cells.get((label, target.length))
            if (not _applies(case_by_label[label], target.name, target.options) or cell is None
                    or cell.speedup_vs_full is None):
                continue
            length = overtakes[label]
            results.append(TargetResult(length is not None and length <= target.length, (
                f"{label}: overtakes full at N <= {target.length} (target for {target.title}): "
                f"{_overtaking_text(length)}, {cell.speedup_vs_full:.2f}x at N={target.length}")))
    return results


# ---------------------------------------------------------------------------
# Output: table, CSV, figure


def _number(value: float | None, digits: int) -> str:
    return "" if value is None else f"{value:.{digits}f}"


def _csv_number(value: float | None) -> str:
    """Six significant digits: ratios recomputed from the CSV agree to 1e-5."""
    return "" if value is None else f"{value:.6g}"


def measurement_rows(measurements: list[Measurement], config: BenchmarkConfig) -> list[dict]:
    """One dict per cell with the CSV_COLUMNS keys."""
    rows = []
    for cell in measurements:
        rows.append({
            "length": cell.length, "attention": cell.case.label, "name": cell.case.name,
            "options": cell.case.options_text, "status": cell.status, "batch": config.batch,
            "heads": config.heads, "dim": config.dim, "dtype": str(config.dtype).replace("torch.", ""),
            "device": str(config.device), "threads": config.threads if config.device.type == "cpu" else "",
            "repeats": len(cell.times_ms),
            "median_ms": _csv_number(cell.median_ms),
            "time_per_element_us": _csv_number(cell.time_per_element_us(config.batch)),
            "peak_memory_bytes": "" if cell.peak_bytes is None else cell.peak_bytes,
            "peak_memory_mib": _csv_number(cell.peak_memory_mib()),
            "memory_per_element_kib": _csv_number(cell.memory_per_element_kib(config.batch)),
            "speedup_vs_full": _csv_number(cell.speedup_vs_full),
            "memory_saving_vs_full": _csv_number(cell.memory_saving_vs_full),
        })
    return rows


def format_table(measurements: list[Measurement], config: BenchmarkConfig) -> str:
    headers = ("N", "attention", "median ms", "us/element", "peak MiB", "KiB/element",
               "speedup vs full", "memory saving vs full")
    lines = []
    for cell in measurements:
        if cell.status != "ok":
            lines.append((str(cell.length), cell.case.label, cell.status, "", "", "", "", ""))
            continue
        lines.append((
            str(cell.length), cell.case.label, _number(cell.median_ms, 2),
            _number(cell.time_per_element_us(config.batch), 3),
            _number(cell.peak_memory_mib(), 2), _number(cell.memory_per_element_kib(config.batch), 3),
            "" if cell.speedup_vs_full is None else f"{cell.speedup_vs_full:.2f}x",
            "" if cell.memory_saving_vs_full is None else f"{cell.memory_saving_vs_full:.2f}x"))
    widths = [max(len(header), *(len(line[index]) for line in lines)) if lines else len(header)
              for index, header in enumerate(headers)]

    def render(values):
        # Status text sits in the "median ms" column and may be wider; left-align text columns.
        parts = [value.ljust(width) if index in (1,) else value.rjust(width)
                 for index, (value, width) in enumerate(zip(values, widths))]
        return "  ".join(parts).rstrip()

    out = [render(headers), render(["-" * width for width in widths])]
    previous_length = None
    for line in lines:
        if previous_length is not None and line[0] != previous_length:
            out.append("")
        previous_length = line[0]
        out.append(render(line))
    return "\n".join(out)


def format_targets(results: list[TargetResult]) -> str:
    lines = ["targets (ratios measured in this run):"]
    if not results:
        lines.append("  none apply to this device, dtype, attentions and lengths")
    for result in results:
        lines.append(f"  {'PASS' if result.passed else 'FAIL'}  {result.text}")
    return "\n".join(lines)


def write_csv(rows: list[dict], path: Path) -> None:
    with path.open("w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=CSV_COLUMNS)
        writer.writeheader()
        writer.writerows(rows)


def plot_per_element(measurements: list[Measurement], config: BenchmarkConfig, path: Path) -> None:
    """Fig. 4 of the paper: time and memory per element against N, one line per attention."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import matplotlib.ticker

    figure, (time_axis, memory_axis) = plt.subplots(1, 2, figsize=(11, 4.2))
    labels = list(dict.fromkeys(cell.case.label for cell in measurements))
    for label in labels:
        cells = sorted((cell for cell in measurements
                        if cell.case.label == label and cell.median_ms is not None),
                       key=lambda cell: cell.length)
        if not cells:
            continue
        lengths = [cell.length for cell in cells]
        time_axis.plot(lengths, [cell.time_per_element_us(config.batch) for cell in cells],
                       marker="o", label=label)
        with_memory = [cell for cell in cells if cell.peak_bytes is not None]
        memory_axis.plot([cell.length for cell in with_memory],
                         [cell.memory_per_element_kib(config.batch) for cell in with_memory],
                         marker="o", label=label)
    dtype = str(config.dtype).replace("torch.", "")
    where = (f"{config.device}, {config.threads} threads" if config.device.type == "cpu"
             else str(config.device))
    plain = matplotlib.ticker.FuncFormatter(lambda value, _: f"{value:g}")
    for axis, ylabel in ((time_axis, "time per element (us)"),
                         (memory_axis, "memory per element (KiB)")):
        axis.set_xscale("log", base=2)
        axis.set_yscale("log")
        axis.xaxis.set_major_formatter(plain)
        # Plain numbers; minor ticks labelled only where the axis spans few decades.
        axis.yaxis.set_major_formatter(matplotlib.ticker.LogFormatter(labelOnlyBase=False))
        axis.yaxis.set_minor_formatter(matplotlib.ticker.LogFormatter(labelOnlyBase=False))
        axis.set_xlabel("sequence length N")
        axis.set_ylabel(ylabel)
        axis.grid(True, which="both", alpha=0.3)
    time_axis.set_title("forward+backward time per element")
    memory_axis.set_title("forward+backward peak memory per element")
    memory_axis.legend(loc="best", fontsize="small")
    figure.suptitle(f"batch {config.batch}, {config.heads} heads x {config.dim}, {dtype}, {where}")
    figure.tight_layout()
    figure.savefig(path, dpi=120)
    plt.close(figure)


def warn_if_cpu_is_busy(config: BenchmarkConfig) -> None:
    """Other processes on the CPUs slow multi-threaded kernels unevenly (threads wait for
    each other), so even the ratios of a run on a busy machine are unreliable."""
    if config.device.type != "cpu" or not hasattr(os, "getloadavg"):
        return
    load, cpus = os.getloadavg()[0], os.cpu_count() or 1
    if load >= 0.5 * cpus:
        print(f"warning: load average {load:.1f} on {cpus} CPUs: other processes compete with "
              f"the benchmark's {config.threads} threads; timings and ratios will be noisy. "
              "Run it on an idle machine for numbers to report.", file=sys.stderr, flush=True)


def format_header(config: BenchmarkConfig, cases: list[BenchmarkCase]) -> str:
    dtype = str(config.dtype).replace("torch.", "")
    where = (f"{config.device}, {torch.get_num_threads()} threads" if config.device.type == "cpu"
             else f"{config.device} ({torch.cuda.get_device_name(config.device)})")
    if config.device.type == "cpu" and hasattr(os, "getloadavg"):
        where += f"; load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs at start"
    lines = [f"attention forward+backward benchmark: torch {torch.__version__}, {where}",
             f"batch {config.batch}, {config.heads} heads, dim {config.dim}, {dtype}; "
             f"median of {config.repeats} after {config.warmup} warm-up; seed {config.seed}",
             "attentions:"]
    for case in cases:
        extra = []
        if case.shared_qk:
            extra.append("k = q")
        if case.max_length is not None:
            extra.append(f"up to N={case.max_length}")
        suffix = f"  [{', '.join(extra)}]" if extra else ""
        lines.append(f"  {case.label} = {case.name}({case.options_text}){suffix}")
    return "\n".join(lines)


# ---------------------------------------------------------------------------
# Command line


def _split_list(values: list[str]) -> list[str]:
    """Accepts both `--x a b` and `--x a,b`; a value with ':' is one spec whose settings
    hold commas (`lsh-4:chunk_size=64,rounds=...`), so it is not split."""
    items = []
    for value in values:
        if ":" in value:   # a spec with settings, e.g. lsh-4:chunk_size=64,rounds=...
            items.append(value)
        else:
            items.extend(part for part in value.split(",") if part.strip())
    return items


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"{value} must be >= 1")
    return value


DTYPES = {"float32": torch.float32, "float64": torch.float64, "float16": torch.float16,
          "bfloat16": torch.bfloat16}


def build_parser() -> argparse.ArgumentParser:
    targets = "\n".join(
        ["  on cpu in float32:"]
        + [f"    {target.title}: speedup vs full >= {target.minimum:g}x at N={target.length}"
           for target in SPEEDUP_TARGETS]
        + [f"    {target.title}: time per element within {target.factor:g}x (max/min) over the "
           f"measured N in {target.shortest}..{target.longest}" for target in LINEAR_SCALING_TARGETS]
        + ["  on cuda in bfloat16:"]
        + [f"    {target.title}: faster than full at N={target.length} and every longer N measured"
           for target in OVERTAKING_TARGETS])
    shared_qk = sorted(name for name, entry in available_attentions().items() if entry.needs_shared_qk)
    columns = textwrap.fill(", ".join(CSV_COLUMNS), width=78, initial_indent="  ",
                            subsequent_indent="  ")
    epilog = f"""\
attention specs (parse_attention_spec):
{accepted_spec_forms()}
  e.g. full, clustered-100, i-clustered-100, lsh-4, lsh-4:chunk_size=64, oracle-top-32
  {" and ".join(shared_qk)} {"is" if len(shared_qk) == 1 else "are"} called with k = q (the same tensor).

what is measured (every N and attention interleaved repeat by repeat):
  time    wall-clock of out = attn(q, k, v); out.backward(grad) with q, k, v
          requiring grad and a fixed random grad; median over --repeats after
          --warmup passes (cuda: synchronized before and after).
  memory  peak tensor memory of one such pass above the level before it (inputs
          excluded; activations saved for backward and the gradients included),
          in a separate pass: cuda max_memory_allocated; on cpu the allocation
          events of torch.profiler(profile_memory=True). Memory taken outside
          PyTorch's allocator is not counted.
  per element = divided by batch * N (as in Fig. 4 of the paper).
  speedup_vs_full = full median time / time; memory_saving_vs_full = full peak /
  peak; both from the same N in the same run, > 1 is better than full.

targets (evaluated on this run's ratios; only those whose attention and lengths,
full included, were measured; each PASS or FAIL with the measured number):
{targets}

output: the table on stdout, then the targets; <out>/benchmark_<device>.csv and
<out>/benchmark_<device>.png (time and memory per element against N, as Fig. 4).
CSV columns:
{columns}
Progress goes to stderr."""
    parser = argparse.ArgumentParser(
        prog="python -m attention_ext.benchmark",
        description=textwrap.fill(
            "Time and peak memory of one attention forward+backward pass per sequence element, "
            "for every attention against full (supplementary C.1 / Fig. 4 of 'Fast Transformers "
            "with Clustered Attention').", width=78),
        epilog=epilog, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--lengths", nargs="+", default=None,
                        metavar="N", help="sequence lengths, space- or comma-separated "
                        f"(default: {' '.join(map(str, DEFAULT_LENGTHS))}; with --device cuda "
                        f"{' '.join(map(str, DEFAULT_CUDA_LENGTHS))})")
    parser.add_argument("--attentions", nargs="+", default=list(DEFAULT_ATTENTIONS),
                        metavar="SPEC", help="attention specs, see below; the first spec named "
                        "full is the reference of the ratios (default: "
                        f"{' '.join(DEFAULT_ATTENTIONS)})")
    parser.add_argument("--max-length", action="append", default=[], metavar="SPEC=N",
                        help="skip an attention (a spec from --attentions, or a registered name "
                             "for all its specs) above length N, e.g. --max-length full=4096; "
                             "repeatable. Its ratios and targets are then missing above N")
    parser.add_argument("--batch", type=_positive_int, default=1, help="batch size (default: 1)")
    parser.add_argument("--heads", type=_positive_int, default=6, help="heads (default: 6)")
    parser.add_argument("--dim", type=_positive_int, default=64, help="head dimension (default: 64)")
    parser.add_argument("--dtype", choices=sorted(DTYPES), default="float32",
                        help="dtype of q, k, v (default: float32)")
    parser.add_argument("--device", default="cpu",
                        help="cpu (default) or cuda / cuda:<index>")
    parser.add_argument("--threads", type=_positive_int, default=2,
                        help="torch.set_num_threads on cpu (default: 2)")
    parser.add_argument("--warmup", type=int, default=1,
                        help="untimed passes per attention and N before timing (default: 1)")
    parser.add_argument("--repeats", type=_positive_int, default=5,
                        help="timed passes per attention and N; the median is reported (default: 5)")
    parser.add_argument("--seed", type=int, default=0, help="seed of inputs and attentions (default: 0)")
    parser.add_argument("--out", type=Path, default=Path("benchmark_results"),
                        help="folder for the CSV and PNG (default: benchmark_results/)")
    return parser


def config_from_args(args: argparse.Namespace, parser: argparse.ArgumentParser) -> BenchmarkConfig:
    lengths = []
    if args.lengths is None:
        on_cuda = args.device.startswith("cuda")
        args.lengths = [str(n) for n in (DEFAULT_CUDA_LENGTHS if on_cuda else DEFAULT_LENGTHS)]
    for text in _split_list(args.lengths):
        try:
            length = int(text)
        except ValueError:
            parser.error(f"--lengths: {text!r} is not an integer")
        if length < 1:
            parser.error(f"--lengths: {length} must be >= 1")
        lengths.append(length)
    max_lengths = {}
    for item in args.max_length:
        key, equals, value = item.partition("=")
        if not equals or not key.strip() or not value.strip().isdigit():
            parser.error(f"--max-length {item!r}: expected SPEC=N, e.g. full=4096")
        max_lengths[key.strip()] = int(value)
    try:
        device = torch.device(args.device)
    except RuntimeError:
        parser.error(f"--device {args.device!r} is not a device; use cpu or cuda[:index]")
    if device.type not in ("cpu", "cuda"):
        parser.error(f"--device {args.device!r}: only cpu and cuda are supported")
    if device.type == "cuda" and not torch.cuda.is_available():
        parser.error(f"--device {args.device}: this torch ({torch.__version__}) sees no CUDA device")
    if args.warmup < 0:
        parser.error(f"--warmup {args.warmup} must be >= 0")
    return BenchmarkConfig(
        lengths=list(dict.fromkeys(lengths)), attentions=_split_list(args.attentions),
        batch=args.batch, heads=args.heads, dim=args.dim, dtype=DTYPES[args.dtype],
        device=device, threads=args.threads, warmup=args.warmup, repeats=args.repeats,
        seed=args.seed, max_lengths=max_lengths)


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    config = config_from_args(args, parser)
    try:
        cases = build_cases(config)
    except AttentionConfigError as error:
        parser.error(str(error))
    if config.device.type == "cpu":
        torch.set_num_threads(config.threads)
    print(format_header(config, cases), flush=True)
    warn_if_cpu_is_busy(config)
    measurements = run_benchmark(config, cases)
    print()
    print(format_table(measurements, config))
    print()
    print(format_overtaking(overtaking_lengths(measurements)))
    print()
    print(format_targets(evaluate_targets(measurements, config.batch, config.device.type, config.dtype)))
    args.out.mkdir(parents=True, exist_ok=True)
    stem = f"benchmark_{config.device.type}"
    csv_path, png_path = args.out / f"{stem}.csv", args.out / f"{stem}.png"
    write_csv(measurement_rows(measurements, config), csv_path)
    plot_per_element(measurements, config, png_path)
    print(f"\nwrote {csv_path} and {png_path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

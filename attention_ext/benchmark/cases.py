"""What a benchmark run measures: its settings, the attention cases, the measured cells.

A cell is one (N, attention) pair; its ratios to full come from the `full` cell of the
same N in the same run.
"""
from __future__ import annotations

import statistics
from dataclasses import dataclass, field

import torch

from ..comparisons import benchmark_attentions
from ..registry import AttentionConfigError, parse_attention_spec

DEFAULT_LENGTHS = (512, 1024, 2048, 4096, 8192)
# On a GPU the lengths where the linear attentions are meant to overtake SDPA (clustered
# at N <= 8192, i-clustered at N <= 16384 in bfloat16) and beyond.
DEFAULT_CUDA_LENGTHS = (1024, 2048, 4096, 8192, 16384, 32768, 65536)
# C.1's attentions, then this project's further ones (declared in attention_ext.comparisons).
DEFAULT_ATTENTIONS = benchmark_attentions()


@dataclass(frozen=True)
class BenchmarkShape:
    """A table of the benchmark: the batch, heads, head dim and lengths it measures, unless
    --batch, --heads, --dim or --lengths override them (for every table of the run)."""
    name: str
    title: str
    batch: int
    heads: int
    dim: int
    lengths: tuple[int, ...]
    cuda_lengths: tuple[int, ...]


# The paper's setting (supplementary C.1): one long sequence. Its targets are defined for it.
PAPER_SHAPE = BenchmarkShape("paper", "paper shapes (supplementary C.1): one long sequence", 1, 6, 64,
                             DEFAULT_LENGTHS, DEFAULT_CUDA_LENGTHS)
# A training batch of real speech corpora (issue 19: batch 32, 4 heads x 64, N = 256..2048
# frames): what attention costs in one training step. It has no targets.
ASR_LENGTHS = (256, 512, 1024, 2048)
ASR_SHAPE = BenchmarkShape("asr", "ASR shapes: a training batch of 32 utterances", 32, 4, 64,
                           ASR_LENGTHS, ASR_LENGTHS)
SHAPES = {shape.name: shape for shape in (PAPER_SHAPE, ASR_SHAPE)}


def default_shapes(device_type: str) -> tuple[str, ...]:
    """The tables a run makes unless --shapes says otherwise: on cuda both, on cpu the
    paper's (the ASR table at batch 32 takes minutes of full attention on two cores)."""
    return ("paper", "asr") if device_type == "cuda" else ("paper",)


MIB = 2 ** 20
KIB = 2 ** 10


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
    shape: str = "paper"           # the table (SHAPES) this run measures


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

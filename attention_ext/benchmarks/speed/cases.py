"""What a benchmark run measures: its settings, the attention cases, the measured cells.

A cell is one (N, attention) pair; its ratios to full come from the `full` cell of the
same N in the same run.
"""
from __future__ import annotations

import contextlib
import statistics
import warnings
from dataclasses import dataclass, field

import torch

from ...comparisons import benchmark_attentions
from ...registry import AttentionConfigError, parse_attention_spec

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
    passes: tuple[str, ...] = ("forward+backward",)   # PASSES measured, one table each
    time_budget_s: float | None = None   # a cell estimated to take longer per pass is skipped
    full_backend: str = "auto"           # SDPA_BACKENDS: the SDPA kernel full runs with


# What one measured pass is: the attention's forward alone (under torch.no_grad, as at inference),
# or its forward then a backward from a fixed random gradient (as in training).
PASSES = ("forward", "forward+backward")
# The paper's setting (supplementary C.1): one long sequence. Its targets are defined for it.
PAPER_SHAPE = BenchmarkShape("paper", "paper shapes (supplementary C.1): one long sequence", 1, 6, 64,
                             DEFAULT_LENGTHS, DEFAULT_CUDA_LENGTHS)
# A training batch of real speech corpora (batch 32, 4 heads x 64, N = 256..2048
# frames): what attention costs in one training step. It has no targets.
ASR_LENGTHS = (256, 512, 1024, 2048)
ASR_SHAPE = BenchmarkShape("asr", "ASR shapes: a training batch of 32 utterances", 32, 4, 64,
                           ASR_LENGTHS, ASR_LENGTHS)
# Long sequences (an hour of audio is ~180,000 encoder positions at the demo's frame rate): the
# demo model's attention (4 heads x 32, conf/model/synth.yaml), one sequence, both passes. Exact
# attention runs through SDPA's FlashAttention kernel (on the CPU too: its memory is linear in N)
# as far as the time budget lets it; the targets (targets.LONG_SCALING_TARGETS) hold over the
# table's lengths, shortest to longest.
LONG_LENGTHS = (16384, 65536, 262144)
LONG_SHAPE = BenchmarkShape("long", "long sequences: the demo model's attention (4 heads x 32), one sequence",
                            1, 4, 32, LONG_LENGTHS, LONG_LENGTHS, passes=PASSES, time_budget_s=120.0,
                            full_backend="flash")
SHAPES = {shape.name: shape for shape in (PAPER_SHAPE, ASR_SHAPE, LONG_SHAPE)}
# --full-backend: "auto" lets torch choose; the others force one SDPA kernel (torch.nn.attention).
SDPA_BACKENDS = ("auto", "flash", "efficient", "math", "cudnn")


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
    sdpa_backend: str = "auto"      # full only: the SDPA kernel its calls are restricted to

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
    backward: bool = True          # forward+backward passes; False: forward alone, under no_grad
    time_budget_s: float | None = None   # see timing.BenchmarkRounds: cells estimated slower are skipped
    full_backend: str = "auto"     # SDPA_BACKENDS

    @property
    def pass_name(self) -> str:
        return PASSES[1] if self.backward else PASSES[0]


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
                                   attention.build().to(config.device), attention.needs_shared_qk,
                                   sdpa_backend=config.full_backend if attention.name == "full" else "auto"))
    by_label = {case.label: case for case in cases}
    for key, limit in config.max_lengths.items():
        matched = [case for case in cases if key in (case.label, case.name)]
        if not matched:
            raise AttentionConfigError(
                f"--max-length {key}={limit}: {key!r} is none of the benchmarked attentions "
                f"({', '.join(by_label)}); give a spec from --attentions or a registered name")
        for case in matched:
            case.max_length = limit
    for case in cases:
        if case.sdpa_backend != "auto":
            check_sdpa_backend_runs(case, config)
    return cases


def sdpa_backend(name: str):
    """torch.nn.attention's SDPBackend of a --full-backend name other than auto."""
    from torch.nn.attention import SDPBackend
    return {"flash": SDPBackend.FLASH_ATTENTION, "efficient": SDPBackend.EFFICIENT_ATTENTION,
            "math": SDPBackend.MATH, "cudnn": SDPBackend.CUDNN_ATTENTION}[name]


def sdpa_context(case: BenchmarkCase):
    """The context a call of `case` runs in: its forced SDPA kernel, or nothing."""
    if case.sdpa_backend == "auto":
        return contextlib.nullcontext()
    from torch.nn.attention import sdpa_kernel
    return sdpa_kernel(sdpa_backend(case.sdpa_backend))


def check_sdpa_backend_runs(case: BenchmarkCase, config: BenchmarkConfig) -> None:
    """One tiny call of full with the forced kernel, so that a kernel torch lacks for this device
    and dtype (FlashAttention in float32 on CUDA) is a usage error before anything is measured."""
    q = torch.randn(config.batch, config.heads, 16, config.dim).to(config.device, config.dtype)
    try:
        with sdpa_context(case), warnings.catch_warnings():
            warnings.simplefilter("ignore")   # torch warns why each kernel declined; the error says it
            case.module(q, q, q)
    except RuntimeError as error:
        raise AttentionConfigError(
            f"--full-backend {case.sdpa_backend}: torch's SDPA has no such kernel for {config.dtype} on "
            f"{config.device} ({str(error).splitlines()[0]}); choose another or auto") from None


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

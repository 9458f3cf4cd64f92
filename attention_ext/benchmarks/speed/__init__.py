"""Time and memory of one attention forward+backward (or forward) pass per sequence element.

    python -m attention_ext.benchmarks.speed                      # the defaults (see --help)
    python -m attention_ext.benchmarks.speed --lengths 1024 4096 --attentions full lsh-1 i-clustered-100
    python -m attention_ext.benchmarks.speed --shapes long        # N = 16k, 64k, 256k, forward and forward+backward

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
pass runs under the profiler (CPU), which would distort timings. A table may skip cells whose
pass is estimated to exceed its time budget (the long table: exact attention at N=262,144).

The modules: `cases` (the run's settings, the attentions, the measured cells),
`timing` (the interleaved passes), `memory` (peak tensor memory on CPU and CUDA),
`targets` (the speedup, scaling and overtaking targets, the long table's), `report` (table, CSV, PNG)
and `__main__` (the command line).
"""
from .cases import BenchmarkCase, BenchmarkConfig, Measurement, add_ratios_to_full, build_cases
from .memory import cpu_peak_memory_bytes, cuda_peak_memory_bytes, peak_memory_bytes
from .report import (CSV_COLUMNS, format_header, format_overtaking, format_table, format_targets,
                     measurement_rows, plot_per_element, write_csv)
from .targets import TargetResult, evaluate_long_targets, evaluate_targets, overtaking_lengths
from .timing import estimated_pass_seconds, run_benchmark

__all__ = [
    "BenchmarkCase", "BenchmarkConfig", "Measurement", "add_ratios_to_full", "build_cases",
    "cpu_peak_memory_bytes", "cuda_peak_memory_bytes", "peak_memory_bytes",
    "CSV_COLUMNS", "format_header", "format_overtaking", "format_table", "format_targets",
    "measurement_rows", "plot_per_element", "write_csv",
    "TargetResult", "evaluate_long_targets", "evaluate_targets", "overtaking_lengths",
    "estimated_pass_seconds", "run_benchmark",
]

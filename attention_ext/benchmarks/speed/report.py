"""What a run reports: the header, the table, where attentions overtake full, the targets,
the CSV and the figure (time and memory per element against N, as Fig. 4 of the paper)."""
from __future__ import annotations

import csv
import os
from pathlib import Path

import torch

from .cases import BenchmarkCase, BenchmarkConfig, Measurement
from .targets import TargetResult, overtaking_text

CSV_COLUMNS = (
    "length", "attention", "name", "options", "status", "pass", "batch", "heads", "dim", "dtype",
    "device", "threads", "repeats", "median_ms", "time_per_element_us", "peak_memory_bytes",
    "peak_memory_mib", "memory_per_element_kib", "speedup_vs_full", "memory_saving_vs_full",
)


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
            "options": cell.case.options_text, "status": cell.status, "pass": config.pass_name,
            "batch": config.batch,
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


def format_overtaking(overtakes: dict[str, int | None]) -> str:
    lines = ["where each attention overtakes full (faster at that N and at every longer N measured):"]
    if not overtakes:
        lines.append("  no attention was compared with full")
    for label, length in overtakes.items():
        lines.append(f"  {label}: {overtaking_text(length)}")
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
    time_axis.set_title(f"{config.pass_name} time per element")
    memory_axis.set_title(f"{config.pass_name} peak memory per element")
    memory_axis.legend(loc="best", fontsize="small")
    figure.suptitle(f"batch {config.batch}, {config.heads} heads x {config.dim}, {dtype}, {where}")
    figure.tight_layout()
    figure.savefig(path, dpi=120)
    plt.close(figure)


def routes_line(device_type: str, dtype: torch.dtype = torch.float32) -> str:
    """Which route the run takes where there is a choice: the instruction sets torch's own kernels
    (SDPA, MKL's products) use, and clustered attention's centroid route on this device and dtype."""
    from ...attentions.clustered import centroid_route, centroid_routes
    forced = centroid_routes.forced_route(device_type) is not None
    route = (f"clustered centroid route {centroid_route(device_type, dtype)}"
             + ("" if forced else f" (the dispatch's choice for {dtype})"))
    if device_type != "cpu":
        return f"routes: {route}"
    mkl = os.environ.get("MKL_ENABLE_INSTRUCTIONS", "MKL's choice")
    return (f"routes: {route}; ATen CPU capability {torch.backends.cpu.get_cpu_capability()}, "
            f"MKL_ENABLE_INSTRUCTIONS={mkl}")


def format_header(config: BenchmarkConfig, cases: list[BenchmarkCase]) -> str:
    dtype = str(config.dtype).replace("torch.", "")
    where = (f"{config.device}, {torch.get_num_threads()} threads" if config.device.type == "cpu"
             else f"{config.device} ({torch.cuda.get_device_name(config.device)})")
    if config.device.type == "cpu" and hasattr(os, "getloadavg"):
        where += f"; load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs at start"
    lines = [f"attention {config.pass_name} benchmark: torch {torch.__version__}, {where}",
             f"batch {config.batch}, {config.heads} heads, dim {config.dim}, {dtype}; "
             f"median of {config.repeats} after {config.warmup} warm-up; seed {config.seed}",
             routes_line(config.device.type, config.dtype)]
    if config.time_budget_s is not None:
        lines.append(f"time budget {config.time_budget_s:g} s per pass: a cell whose first pass is estimated "
                     "longer (the attention's pass at the longest shorter N x (N ratio)^2) is skipped; one "
                     "untimed first call per attention at the shortest N before the rounds")
    lines.append("attentions:")
    for case in cases:
        extra = []
        if case.shared_qk:
            extra.append("k = q")
        if case.max_length is not None:
            extra.append(f"up to N={case.max_length}")
        if case.sdpa_backend != "auto":
            extra.append(f"SDPA kernel {case.sdpa_backend}")
        suffix = f"  [{', '.join(extra)}]" if extra else ""
        lines.append(f"  {case.label} = {case.name}({case.options_text}){suffix}")
    return "\n".join(lines)

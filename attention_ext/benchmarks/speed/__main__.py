"""The command line: python -m attention_ext.benchmarks.speed [--lengths N...] [--attentions SPEC...] ..."""
from __future__ import annotations

import argparse
import os
import sys
import textwrap
from pathlib import Path

import torch

from ...registry import AttentionConfigError, accepted_spec_forms, available_attentions
from .cases import (DEFAULT_ATTENTIONS, PASSES, SDPA_BACKENDS, SHAPES, BenchmarkConfig, build_cases,
                    default_shapes)
from .report import (CSV_COLUMNS, format_header, format_overtaking, format_table, format_targets,
                     measurement_rows, plot_per_element, write_csv)
from .targets import (CUDA_SCALING_TARGETS, LINEAR_SCALING_TARGETS, LONG_SCALING_TARGETS, OVERTAKING_TARGETS,
                      SPEEDUP_TARGETS, evaluate_long_targets, evaluate_targets, overtaking_lengths)
from .timing import run_benchmark


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


def _budget_seconds(text: str) -> float | None:
    """--time-budget: seconds > 0, or none."""
    if text.strip().lower() == "none":
        return None
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is neither a number of seconds nor none") from None
    if not value > 0:
        raise argparse.ArgumentTypeError(f"{text}: give seconds > 0, or none for no budget")
    return value


DTYPES = {"float32": torch.float32, "float64": torch.float64, "float16": torch.float16,
          "bfloat16": torch.bfloat16}


def targets_help() -> str:
    """The targets of --help, by the device and dtype of a run they apply to."""
    return "\n".join(
        ["  the paper table, forward+backward, on cpu in float32:"]
        + [f"    {target.title}: speedup vs full >= {target.minimum:g}x at N={target.length}"
           for target in SPEEDUP_TARGETS]
        + [f"    {target.title}: {target.quantity} per element within {target.factor:g}x (max/min) "
           f"over the measured N in {target.shortest}..{target.longest}" for target in LINEAR_SCALING_TARGETS]
        + ["  the paper table, forward+backward, on cuda in bfloat16:"]
        + [f"    {target.title}: faster than full at N={target.length} and every longer N measured"
           for target in OVERTAKING_TARGETS]
        + [f"    {target.title}: {target.quantity} per element within {target.factor:g}x (max/min) "
           f"over the measured N in {target.shortest}..{target.longest}" for target in CUDA_SCALING_TARGETS]
        + ["  the long table, on cpu (time and memory) and cuda (memory), any dtype:"]
        + [f"    {target.title}: {target.quantity} per element within {target.factor:g}x (max/min) over "
           "the run's lengths, each of them measured" for target in LONG_SCALING_TARGETS])


def tables_help() -> str:
    """The tables of --help (--shapes): their batch, heads, head dim and lengths."""
    return "\n".join(
        f"  {shape.name}: {shape.title}; batch {shape.batch}, {shape.heads} heads x {shape.dim}, "
        f"N = {' '.join(map(str, shape.lengths))}"
        + ("" if shape.cuda_lengths == shape.lengths else
           f" (cuda: {' '.join(map(str, shape.cuda_lengths))})")
        + f"; {' and '.join(shape.passes)}"
        + ("" if shape.time_budget_s is None else f"; time budget {shape.time_budget_s:g} s")
        + ("" if shape.full_backend == "auto" else f"; full with SDPA kernel {shape.full_backend}")
        for shape in SHAPES.values())


def epilog() -> str:
    """--help after the options: the specs, what is measured, the tables, targets and output."""
    shared_qk = sorted(name for name, entry in available_attentions().items() if entry.needs_shared_qk)
    columns = textwrap.fill(", ".join(CSV_COLUMNS), width=78, initial_indent="  ",
                            subsequent_indent="  ")
    return f"""\
attention specs (parse_attention_spec):
{accepted_spec_forms()}
  e.g. full, clustered-100, i-clustered-100, lsh-4, lsh-4:chunk_size=64, oracle-top-32
  {" and ".join(shared_qk)} {"is" if len(shared_qk) == 1 else "are"} called with k = q (the same tensor).

what is measured (every N and attention interleaved repeat by repeat):
  time    wall-clock of out = attn(q, k, v); out.backward(grad) with q, k, v
          requiring grad and a fixed random grad (--passes forward: the forward
          alone, under torch.no_grad); median over --repeats after --warmup
          passes (cuda: synchronized before and after).
  memory  peak tensor memory of one such pass above the level before it (inputs
          excluded; activations saved for backward and the gradients included),
          in a separate pass: cuda max_memory_allocated; on cpu the allocation
          events of torch.profiler(profile_memory=True). Memory taken outside
          PyTorch's allocator is not counted.
  per element = divided by batch * N (as in Fig. 4 of the paper).
  speedup_vs_full = full median time / time; memory_saving_vs_full = full peak /
  peak; both from the same N in the same run, > 1 is better than full.

tables (--shapes; default: paper on cpu, paper and asr on cuda):
{tables_help()}
  --batch, --heads, --dim, --lengths, --passes, --time-budget and --full-backend,
  when given, replace those of every table. The asr table has no targets.

targets (evaluated on this run's ratios; only those whose attention and lengths,
full included, were measured; each PASS or FAIL with the measured number):
{targets_help()}

output: per table and pass, the table on stdout, then the targets;
<out>/benchmark_<device>.csv and <out>/benchmark_<device>.png (time and memory per
element against N, as Fig. 4) for the paper table, benchmark_<device>_<table>.csv/.png
for the others, with _forward before .csv/.png for the forward pass.
CSV columns:
{columns}
Progress goes to stderr."""


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m attention_ext.benchmarks.speed",
        description=textwrap.fill(
            "Time and peak memory of one attention forward+backward (or forward) pass per sequence element, "
            "for every attention against full (supplementary C.1 / Fig. 4 of 'Fast Transformers "
            "with Clustered Attention').", width=78),
        epilog=epilog(), formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--shapes", nargs="+", default=None, metavar="TABLE",
                        help=f"tables to measure, among {', '.join(SHAPES)} (default: paper on cpu, "
                             "paper and asr on cuda); see 'tables' below")
    parser.add_argument("--lengths", nargs="+", default=None,
                        metavar="N", help="sequence lengths, space- or comma-separated "
                        "(default: each table's, see below)")
    parser.add_argument("--passes", nargs="+", choices=PASSES, default=None,
                        help="what one pass is: forward (under torch.no_grad) and/or forward+backward; "
                             "one table each (default: each table's: long both, others forward+backward)")
    parser.add_argument("--time-budget", type=_budget_seconds, default=argparse.SUPPRESS, metavar="SECONDS",
                        help="skip a cell whose first pass is estimated to take longer (from the "
                             "attention's pass at the longest shorter N, x (N ratio)^2), and its "
                             "attention at longer N; 'none': no budget (default: each table's: "
                             "long 120, others none)")
    parser.add_argument("--full-backend", choices=SDPA_BACKENDS, default=None,
                        help="the SDPA kernel full runs with (torch.nn.attention.sdpa_kernel); auto: "
                             "torch's choice (default: each table's: long flash, others auto)")
    parser.add_argument("--attentions", nargs="+", default=list(DEFAULT_ATTENTIONS),
                        metavar="SPEC", help="attention specs, see below; the first spec named "
                        "full is the reference of the ratios (default: "
                        f"{' '.join(DEFAULT_ATTENTIONS)})")
    parser.add_argument("--max-length", action="append", default=[], metavar="SPEC=N",
                        help="skip an attention (a spec from --attentions, or a registered name "
                             "for all its specs) above length N, e.g. --max-length full=4096; "
                             "repeatable. Its ratios and targets are then missing above N")
    parser.add_argument("--batch", type=_positive_int, default=None,
                        help="batch size (default: each table's: paper 1, asr 32)")
    parser.add_argument("--heads", type=_positive_int, default=None,
                        help="heads (default: each table's: paper 6, asr 4)")
    parser.add_argument("--dim", type=_positive_int, default=None,
                        help="head dimension (default: each table's: 64)")
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


def config_from_args(args: argparse.Namespace, parser: argparse.ArgumentParser) -> list[BenchmarkConfig]:
    """One BenchmarkConfig per table (--shapes), in the order given."""
    lengths = []
    for text in _split_list(args.lengths or []):
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
    names = _split_list(args.shapes) if args.shapes is not None else list(default_shapes(device.type))
    for name in names:
        if name not in SHAPES:
            parser.error(f"--shapes: {name!r} is not a table; choose among {', '.join(SHAPES)}")
    configs = []
    for name in dict.fromkeys(names):
        shape = SHAPES[name]
        default_lengths = shape.cuda_lengths if device.type == "cuda" else shape.lengths
        for pass_name in dict.fromkeys(args.passes or shape.passes):
            configs.append(BenchmarkConfig(
                lengths=list(dict.fromkeys(lengths or default_lengths)), attentions=_split_list(args.attentions),
                batch=args.batch or shape.batch, heads=args.heads or shape.heads, dim=args.dim or shape.dim,
                dtype=DTYPES[args.dtype], device=device, threads=args.threads, warmup=args.warmup,
                repeats=args.repeats, seed=args.seed, max_lengths=max_lengths, shape=name,
                backward=pass_name == "forward+backward",
                time_budget_s=getattr(args, "time_budget", shape.time_budget_s),
                full_backend=args.full_backend or shape.full_backend))
    return configs


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    configs = config_from_args(args, parser)
    try:   # every spec checked before anything is measured
        tables = [(config, build_cases(config)) for config in configs]
    except AttentionConfigError as error:
        parser.error(str(error))
    if configs[0].device.type == "cpu":
        torch.set_num_threads(configs[0].threads)
    args.out.mkdir(parents=True, exist_ok=True)
    for index, (config, cases) in enumerate(tables):
        if index:
            print("\n")
        shape = SHAPES[config.shape]
        # which pass, where the table has two or the run asked for the other one
        which = f", {config.pass_name}" if len(shape.passes) > 1 or config.pass_name not in shape.passes else ""
        print(f"== {shape.title}{which} ==")
        print(format_header(config, cases), flush=True)
        warn_if_cpu_is_busy(config)
        measurements = run_benchmark(config, cases)
        print()
        print(format_table(measurements, config))
        print()
        print(format_overtaking(overtaking_lengths(measurements)))
        print()
        if config.shape == "paper" and config.backward:   # its targets are forward+backward's
            print(format_targets(evaluate_targets(measurements, config.batch, config.device.type,
                                                  config.dtype)))
        elif config.shape == "long":
            print(format_targets(evaluate_long_targets(measurements, config.batch, config.device.type,
                                                       config.lengths)))
        else:
            print(f"targets: none for the {config.shape} table, {config.pass_name} (it shows what attention "
                  "costs there)")
        stem = (f"benchmark_{config.device.type}" + ("" if config.shape == "paper" else f"_{config.shape}")
                + ("" if config.backward else "_forward"))
        csv_path, png_path = args.out / f"{stem}.csv", args.out / f"{stem}.png"
        write_csv(measurement_rows(measurements, config), csv_path)
        plot_per_element(measurements, config, png_path)
        print(f"\nwrote {csv_path} and {png_path}")
    return 0


def command(argv: list[str] | None = None) -> int:
    """main with the project's exit statuses (README.md): 0 done, 2 a bad option (argparse), 1 a
    failure while measuring (its traceback), 130 after Ctrl-C, without a traceback. The library
    imports nothing of the layers above it, so the statuses are stated here."""
    try:
        return main(argv)
    except KeyboardInterrupt:
        print("\nattention_ext.benchmarks.speed: interrupted; nothing was written", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(command())

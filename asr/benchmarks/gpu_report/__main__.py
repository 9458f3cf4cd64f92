"""python -m asr.benchmarks.gpu_report: everything owed on a GPU, in one command of at most 10 minutes.

    python -m asr.benchmarks.gpu_report                     # all parts; a rerun goes on where it stopped
    python -m asr.benchmarks.gpu_report --parts centroid_routes profiles
    python -m asr.benchmarks.gpu_report --redo benchmark_bfloat16
    python -m asr.benchmarks.gpu_report --corpus DIR        # a synth corpus made elsewhere (no espeak-ng there)

Runs the parts of parts.PARTS (the CUDA tests; the benchmark tables in bfloat16 and float32 with
their overtaking points against SDPA; LSH's memory per element to N=65,536; profiles of clustered-100
and i-clustered-100; the centroid routes; 200 training steps of the demo preset eager and with CUDA
graphs; the training-step table of the demo and WSJ presets at a GPU-filling batch, eager, graphed
and compiled, against the plain SDPA model; by name only, 200 compiled steps of the demo preset and
the kernels at long N, the benchmark's long table in bfloat16 with full through FlashAttention),
each in its own process within its budget, saving each part's result in <out>/parts/, and writes
<out>/REPORT.md with the raw CSVs under <out>/csv/. A part that finished (passed or failed) is not
run again; one that errored, timed out or did not fit in the time left is. Exit status: 0 when
every part passed, 1 when a check failed or a part has no verdict, 2 without a CUDA device.
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch

from asr.benchmarks.gpu_report.parts import DEFAULT_PART_NAMES, PART_NAMES, PARTS
from asr.benchmarks.gpu_report.report import all_passed, format_report, load_result, run_parts

TOTAL_BUDGET_SECONDS = 600


def machine_line() -> str:
    if not torch.cuda.is_available():
        return f"no CUDA device (torch {torch.__version__})"
    properties = torch.cuda.get_device_properties(0)
    return (f"{properties.name}, {properties.total_memory / 2**30:.0f} GiB, compute capability "
            f"{properties.major}.{properties.minor}; torch {torch.__version__}, CUDA {torch.version.cuda}; "
            f"{time.strftime('%Y-%m-%d %H:%M')}")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m asr.benchmarks.gpu_report", description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter,
                                     epilog="parts:\n" + "\n".join(f"  {p.name:20s} {p.title} ({p.budget_seconds} s)"
                                                                   for p in PARTS))
    parser.add_argument("--out", type=Path, default=Path("gpu_report"), help="output folder (default: %(default)s)")
    parser.add_argument("--parts", nargs="+", choices=PART_NAMES, default=list(DEFAULT_PART_NAMES),
                        help="default: every part but " + ", ".join(sorted(set(PART_NAMES) - set(DEFAULT_PART_NAMES))))
    parser.add_argument("--redo", nargs="+", choices=PART_NAMES, default=[], help="run these again even if finished")
    parser.add_argument("--budget", type=float, default=TOTAL_BUDGET_SECONDS,
                        help="seconds for this run in all (default: %(default)s)")
    parser.add_argument("--corpus", type=Path, default=None,
                        help="a synthetic corpus prepared on another machine (python -m recipes.synth.prepare "
                             "--out DIR --train 200 --dev 30 --test 30), for a GPU machine without espeak-ng and "
                             "flite: linked as <out>/synth, which the training parts use instead of generating it")
    parser.add_argument("--report-only", action="store_true",
                        help="write REPORT.md from the saved part results without running anything")
    return parser


def link_corpus(corpus: Path, target: Path) -> str | None:
    """Links a prepared synth corpus as the training parts' data root; an error message, or None."""
    corpus = corpus.resolve()
    if not (corpus / "synth_cuts_train.jsonl.gz").is_file():
        return (f"--corpus {corpus} holds no synth_cuts_train.jsonl.gz; prepare one with "
                f"python -m recipes.synth.prepare --out {corpus} --train 200 --dev 30 --test 30")
    if target.is_symlink() or target.exists():
        if target.resolve() == corpus:
            return None
        return f"{target} already holds a corpus; remove it, or leave out --corpus to use it"
    target.parent.mkdir(parents=True, exist_ok=True)
    target.symlink_to(corpus, target_is_directory=True)
    return None


def main(argv: list[str] | None = None, parts=PARTS, cuda_available=torch.cuda.is_available) -> int:
    args = build_parser().parse_args(argv)
    args.out = args.out.resolve()   # the parts run in the repository root
    chosen = tuple(p for p in parts if p.name in args.parts)
    if args.report_only:
        results = [r for r in (load_result(args.out, p.name) for p in chosen) if r is not None]
    else:
        if not cuda_available():
            print("gpu_report: no CUDA device here (torch.cuda.is_available() is False); nothing was run")
            return 2
        problem = link_corpus(args.corpus, args.out / "synth") if args.corpus else None
        if problem:
            print(f"gpu_report: {problem}")
            return 2
        results = run_parts(chosen, args.out, args.budget, tuple(args.redo))
    args.out.mkdir(parents=True, exist_ok=True)
    report = args.out / "REPORT.md"
    report.write_text(format_report(chosen, results, machine_line()))
    print(f"wrote {report}: " + ", ".join(f"{r.name} {r.status}" for r in results))
    return 0 if results and all_passed(results) and len(results) == len(chosen) else 1


if __name__ == "__main__":
    sys.exit(main())

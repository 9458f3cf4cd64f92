"""The train-with x evaluate-with experiment of the paper's sec. 4.1 (Table 1) on the built-in corpus.

    python -m recipes.synth.experiment                      # all six presets, then the matrix
    python -m recipes.synth.experiment --minutes 5          # shorter training per preset
    python -m recipes.synth.experiment --presets synth_full synth_iclustered

Trains the six synth presets one after the other (full, shared_full, lsh1, lsh4, clustered,
iclustered), each for --minutes of wall-clock time, into <out>/<preset>/, then evaluates every
preset's best checkpoint with every evaluate-with spec (`asr.cross_matrix`) into <out>/matrix/.

Run it again after an interruption and it picks up where it stopped: a preset whose run has
results.json is done and skipped, one with checkpoints/last.ckpt is resumed, and the matrix
reuses the cells it has already computed.

The default evaluate-with specs are the paper's rows with the cluster counts scaled to this
corpus: its utterances give ~390 encoder positions (the paper's WSJ ~780), so the presets train
with 64 clusters and the matrix asks for 32 and 64 where the paper has 100 and 200.
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

PRESETS = ("synth_full", "synth_shared_full", "synth_lsh1", "synth_lsh4", "synth_clustered",
           "synth_iclustered")
SMALL, LARGE = 32, 64        # the two cluster counts of the matrix (the paper's 100 and 200)
SPECS = ("full", "shared-full", "lsh-1", "lsh-4", f"clustered-{SMALL}", f"clustered-{LARGE}",
         f"i-clustered-{SMALL}", f"i-clustered-{LARGE}", "oracle-top")


# ---- the paper's findings of sec. 4.1, checked on a matrix ------------------------------------------
def _per(matrix: dict, row: str, column: str) -> float | None:
    for line in matrix["rows"]:
        if line["evaluate_with"] == row:
            cell = line["cells"].get(column)
            return cell["per"] if cell and cell["valid"] else None
    return None


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{100 * value:.2f}"


def paper_findings(matrix: dict, small: int = SMALL, large: int = LARGE) -> list[dict]:
    """Each finding of the paper's sec. 4.1 with the comparisons it rests on, from a cross
    matrix (asr.cross_matrix's matrix.json) with the experiment's rows and columns.

    A finding holds when every one of its comparisons holds; comparisons whose cells are
    missing are left out (and listed as such). Columns are the preset names without "synth_".
    """
    columns = [column["label"] for column in matrix["columns"]]
    findings = []

    def finding(text: str, comparisons: list[tuple[str, bool | None]]) -> None:
        known = [ok for _, ok in comparisons if ok is not None]
        findings.append({"finding": text, "holds": bool(known) and all(known),
                         "held": sum(known), "compared": len(known),
                         "evidence": [line for line, _ in comparisons]})

    def less(a: tuple[str, str], b: tuple[str, str]) -> tuple[str, bool | None]:
        pa, pb = _per(matrix, *a), _per(matrix, *b)
        ok = None if pa is None or pb is None else pa < pb
        mark = {True: "yes", False: "NO", None: "missing"}[ok]
        return f"{a[1]} model: {a[0]} {_pct(pa)} < {b[0]} {_pct(pb)}: {mark}", ok

    approximated = [c for c in ("full", "shared_full") if c in columns]
    finding("i-clustered approximates full and shared-full better than clustered",
            [less((f"i-clustered-{n}", c), (f"clustered-{n}", c)) for c in approximated for n in (small, large)])
    finding("more clusters approximate better (clustered and i-clustered rows)",
            [less((f"{kind}-{large}", c), (f"{kind}-{small}", c)) for c in columns
             for kind in ("clustered", "i-clustered")])
    lsh_checks = []
    if "shared_full" in columns:
        for lsh in ("lsh-1", "lsh-4"):
            lsh_checks.append(less((f"i-clustered-{large}", "shared_full"), (lsh, "shared_full")))
            lsh_checks.append(less(("shared-full", "shared_full"), (lsh, "shared_full")))
    finding("lsh cannot approximate a model trained with full attention (here: the shared-QK one, "
            "the only full model lsh can run on): lsh is worse than i-clustered and than exact attention",
            lsh_checks)
    finding("oracle-top (each query's 32 best keys) is worse than i-clustered",
            [less((f"i-clustered-{large}", c), ("oracle-top", c)) for c in columns])
    return findings


def format_findings(findings: list[dict]) -> str:
    lines = []
    for item in findings:
        verdict = "holds" if item["holds"] else "does not hold"
        lines.append(f"- **{item['finding']}**: {verdict} here ({item['held']} of {item['compared']} "
                     "comparisons, PER %)")
        lines += [f"  - {line}" for line in item["evidence"]]
    return "\n".join(lines) + "\n"


def train_preset(preset: str, run_dir: Path, minutes: float, overrides: list[str]) -> None:
    """Trains (or resumes) one preset in run_dir with `python -m asr.train`."""
    command = [sys.executable, "-m", "asr.train", f"conf={preset}", f"run_dir={run_dir}",
               f"trainer.max_minutes={minutes}", *overrides]
    if (run_dir / "checkpoints" / "last.ckpt").is_file():
        command.append(f"ckpt_path={run_dir / 'checkpoints' / 'last.ckpt'}")
    print(f"[experiment] {' '.join(command[1:])}", flush=True)
    subprocess.run(command, check=True)


def best_checkpoint(run_dir: Path) -> Path:
    path = run_dir / "checkpoints" / "best.ckpt"
    if not path.is_file():
        raise SystemExit(f"recipes.synth.experiment: {run_dir} finished without checkpoints/best.ckpt; "
                         f"see {run_dir / 'train.log'}")
    return path


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m recipes.synth.experiment", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=Path("runs/synth_experiment"),
                        help="folder of the runs and the matrix (default: runs/synth_experiment)")
    parser.add_argument("--presets", nargs="+", default=list(PRESETS), metavar="PRESET",
                        help="train-with presets, the matrix's columns (default: the six synth ones)")
    parser.add_argument("--specs", nargs="+", default=list(SPECS), metavar="SPEC",
                        help=f"evaluate-with attention specs, the rows (default: {' '.join(SPECS)})")
    parser.add_argument("--minutes", type=float, default=12.0,
                        help="wall-clock training budget per preset (default: 12)")
    parser.add_argument("--split", default="test", help="split the matrix is scored on (default: test)")
    parser.add_argument("--train-override", action="append", default=[], metavar="KEY=VALUE",
                        help="extra asr.train override for every preset (repeatable)")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    started = time.perf_counter()
    checkpoints = []
    for preset in args.presets:
        run_dir = args.out / preset
        if (run_dir / "results.json").is_file():
            print(f"[experiment] {preset}: trained already ({run_dir / 'results.json'})", flush=True)
        else:
            train_preset(preset, run_dir, args.minutes, args.train_override)
        checkpoints.append(f"{preset.removeprefix('synth_')}={best_checkpoint(run_dir)}")
    from asr import cross_matrix
    code = cross_matrix.main([*checkpoints, "--specs", *args.specs, "--split", args.split,
                              "--out", str(args.out / "matrix")])
    if code != 0:
        return code
    matrix = json.loads((args.out / "matrix" / "matrix.json").read_text())
    findings = format_findings(paper_findings(matrix))
    (args.out / "matrix" / "findings.md").write_text(findings)
    print(f"\nthe paper's sec. 4.1 findings on this matrix:\n{findings}")
    print(f"[experiment] done in {(time.perf_counter() - started) / 60:.1f} min; "
          f"matrix and findings.md in {args.out / 'matrix'}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

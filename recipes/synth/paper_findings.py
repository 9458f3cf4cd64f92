"""The paper's findings of sec. 4.1, checked on a matrix of ``recipes.synth.experiment`` (its
findings.md)."""
from __future__ import annotations

from recipes.synth.experiment_settings import LARGE, SMALL


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

    def close(a: tuple[str, str], b: tuple[str, str]) -> tuple[str, bool | None]:
        pa, pb = _per(matrix, *a), _per(matrix, *b)
        ok = None if pa is None or pb is None else abs(pa - pb) <= CLOSE
        mark = {True: "yes", False: "NO", None: "missing"}[ok]
        return f"{a[1]} model: {a[0]} {_pct(pa)} within {100 * CLOSE:.0f} of {b[0]} {_pct(pb)}: {mark}", ok

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
    finding(f"a model trained with clustered or i-clustered attention stays close when evaluated with full "
            f"(within {100 * CLOSE:.0f} PER point of its own attention)",
            [close(("full", c), (_training_row(matrix, c), c)) for c in ("clustered", "iclustered")
             if c in columns])
    return findings


CLOSE = 0.01   # "stays close": the paper's 5.56 vs 5.95 and 7.10 vs 7.06 differ by < 0.4 points


def _training_row(matrix: dict, column: str) -> str:
    """The evaluate-with row that equals the column's training attention (its diagonal cell)."""
    for line in matrix["rows"]:
        if line["cells"].get(column, {}).get("same_as_training"):
            return line["evaluate_with"]
    return "(none)"


def format_findings(findings: list[dict]) -> str:
    lines = []
    for item in findings:
        verdict = "holds" if item["holds"] else "does not hold"
        lines.append(f"- **{item['finding']}**: {verdict} here ({item['held']} of {item['compared']} "
                     "comparisons, PER %)")
        lines += [f"  - {line}" for line in item["evidence"]]
    return "\n".join(lines) + "\n"

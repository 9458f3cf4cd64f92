"""The paper's findings of sec. 4.1, checked on a matrix of ``recipes.synth.experiment`` (its
findings.md): the rankings (paper_findings) and the magnitudes of Table 1's full column beside the
paper's, with whether its gap is reproduced (table1_magnitudes; given the matrix folder, each gap
with its 95 % paired-bootstrap interval over the utterances)."""
from __future__ import annotations

from pathlib import Path

from asr.evaluation.attention_matrix import phone_gap_interval
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


# ---- magnitudes -----------------------------------------------------------------------------------------
# Table 1 of the paper, its "train with full" column: WSJ validation PER (%) of the model trained with
# full attention, evaluated with each row.
PAPER_FULL_COLUMN = {"full": 5.14, "clustered-100": 44.88, "clustered-200": 21.76, "i-clustered-100": 9.29,
                     "i-clustered-200": 6.38, "oracle-top": 17.16}
# What reproducing Table 1's gap means here (PER points on the full model): clustered with the small
# cluster count at least this much worse than full, while i-clustered with it stays within this of full.
CLUSTERED_GAP_AIM = 10.0
ICLUSTERED_GAP_AIM = 3.0


def gap_interval(matrix_folder: Path, column: str, row: str) -> tuple[list[float] | None, str | None]:
    """([low, high] of phone_gap_interval as fractions, None), or (None, why not) where the cells'
    hypotheses cannot give it: a report goes on without the interval."""
    try:
        return list(phone_gap_interval(matrix_folder, column, row)[1:]), None
    except (FileNotFoundError, ValueError) as error:
        return None, str(error)


def table1_magnitudes(matrix: dict, column: str = "full", small: int = 100, large: int = 200,
                      matrix_folder: Path | None = None) -> dict:
    """Table 1's full column beside the same rows of `column` (a model trained with full attention) in
    a cross matrix: PER and gap to full, in points, per row, and whether the aims hold.

    The paper's 100 and 200 clusters are compared with this matrix's `small` and `large` counts. Returns
    {"column", "rows": [{"paper_row", "row", "paper_per", "per", "paper_gap", "gap", "interval"}],
    "aims": [{"aim", "holds", "evidence"}], "reproduced", "no_interval"}: PER and gaps in percent points
    (None where a cell is missing); an aim's holds is None when its cells are missing, and reproduced
    is True only when every aim holds. With `matrix_folder` (the matrix's --out), each gap's interval
    is its 95 % paired bootstrap over the utterances (asr.evaluation.attention_matrix.phone_gap_interval):
    how far the split pins the gap down, not how much it moves from one checkpoint to the next;
    None, with the reason in no_interval, where the cells' hypotheses are missing or do not score
    the cell's PER. The aims read the gap itself.
    """
    def ours(paper_row: str) -> str:
        return paper_row.replace("-100", f"-{small}").replace("-200", f"-{large}")

    def points(value: float | None) -> float | None:
        return None if value is None else 100 * value

    full = points(_per(matrix, "full", column))
    rows, no_interval = [], []
    for paper_row, paper_per in PAPER_FULL_COLUMN.items():
        per = points(_per(matrix, ours(paper_row), column))
        gap = None if per is None or full is None else per - full
        interval = None
        if matrix_folder is not None and gap is not None and paper_row != "full":
            interval, reason = gap_interval(matrix_folder, column, ours(paper_row))
            if interval is None:
                no_interval.append(reason)
            else:
                interval = [points(bound) for bound in interval]
        rows.append({"paper_row": paper_row, "row": ours(paper_row), "paper_per": paper_per, "per": per,
                     "paper_gap": paper_per - PAPER_FULL_COLUMN["full"], "gap": gap, "interval": interval})
    by_paper_row = {row["paper_row"]: row for row in rows}

    def aim(text: str, paper_row: str, holds) -> dict:
        gap, interval = by_paper_row[paper_row]["gap"], by_paper_row[paper_row]["interval"]
        verdict = None if gap is None else bool(holds(gap))
        mark = {True: "yes", False: "NO", None: "missing"}[verdict]
        shown = "-" if gap is None else format(gap, "+.2f")
        if interval is not None:
            shown += f" (95 % interval {interval[0]:+.2f} to {interval[1]:+.2f})"
        return {"aim": text, "holds": verdict, "evidence": f"{shown} points: {mark}"}

    aims = [aim(f"clustered-{small} at least {CLUSTERED_GAP_AIM:g} points worse than full",
                "clustered-100", lambda gap: gap >= CLUSTERED_GAP_AIM),
            aim(f"i-clustered-{small} within {ICLUSTERED_GAP_AIM:g} points of full",
                "i-clustered-100", lambda gap: abs(gap) <= ICLUSTERED_GAP_AIM)]
    return {"column": column, "rows": rows, "aims": aims, "reproduced": all(item["holds"] for item in aims),
            "no_interval": no_interval}


def format_magnitudes(magnitudes: dict) -> str:
    """A markdown table of table1_magnitudes (the paper's PER and gaps beside this matrix's), then the aims."""
    def text(value: float | None, sign: str = "") -> str:
        return "-" if value is None else format(value, f"{sign}.2f")

    intervals = any(row.get("interval") for row in magnitudes["rows"])
    lines = [f"Table 1's magnitudes: the model trained with full attention (WSJ in the paper; column "
             f"{magnitudes['column']} here), PER % and gap to full in points"
             + ("; the gap's 95 % interval over the utterances (paired bootstrap)" if intervals else ""), "",
             "| evaluate with | paper PER | paper gap | here | PER here | gap here |"
             + (" 95 % interval |" if intervals else ""),
             "|---|---:|---:|---|---:|---:|" + ("---:|" if intervals else "")]
    for row in magnitudes["rows"]:
        line = (f"| {row['paper_row']} | {text(row['paper_per'])} | {text(row['paper_gap'], '+')} | "
                f"{row['row']} | {text(row['per'])} | {text(row['gap'], '+')} |")
        if intervals:
            interval = row.get("interval")
            line += " - |" if interval is None else f" {interval[0]:+.2f} to {interval[1]:+.2f} |"
        lines.append(line)
    lines.append("")
    verdict = "reproduced" if magnitudes["reproduced"] else "not reproduced"
    lines.append(f"- **the paper's gap (both aims)**: {verdict} here")
    lines += [f"  - {item['aim']}: {item['evidence']}" for item in magnitudes["aims"]]
    lines += [f"- no interval: {reason}" for reason in magnitudes.get("no_interval", [])]
    return "\n".join(lines) + "\n"

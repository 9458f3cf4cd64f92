"""Running the parts with resume, saving each part's result, and writing the Markdown report."""
from __future__ import annotations

import json
import subprocess
import time
from dataclasses import asdict
from pathlib import Path

from asr.benchmarks.gpu_report.checks import Check
from asr.benchmarks.gpu_report.parts import Part, PartResult

REPO_ROOT = Path(__file__).resolve().parents[2]
FINISHED = ("passed", "failed")   # a part that ended with a verdict; "error" and "timeout" run again


def result_path(out: Path, name: str) -> Path:
    return out / "parts" / f"{name}.json"


def save_result(out: Path, result: PartResult) -> None:
    path = result_path(out, result.name)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(asdict(result), indent=2) + "\n")


def load_result(out: Path, name: str) -> PartResult | None:
    path = result_path(out, name)
    if not path.exists():
        return None
    data = json.loads(path.read_text())
    data["checks"] = [Check(**c) for c in data["checks"]]
    return PartResult(**data)


def run_part(part: Part, out: Path) -> PartResult:
    """Runs one part in its own process within its budget; its output goes to parts/<name>.log."""
    log_path = out / "parts" / f"{part.name}.log"
    log_path.parent.mkdir(parents=True, exist_ok=True)
    start = time.perf_counter()
    status = None
    with open(log_path, "w") as log:
        try:
            returncode = subprocess.run(part.command(out), cwd=REPO_ROOT, stdout=log, stderr=subprocess.STDOUT,
                                        timeout=part.budget_seconds).returncode
        except subprocess.TimeoutExpired:
            returncode, status = None, "timeout"
    seconds = time.perf_counter() - start
    text = log_path.read_text(errors="replace")
    try:
        checks, summary, files = part.read(text, out)
    except Exception as error:   # an unreadable output is that part's failure, not the report's
        checks, summary, files = [Check("the part's output could be read", False, f"{type(error).__name__}: {error}")], "", []
    if status is None:
        if any(not c.ok for c in checks):
            status = "failed"
        elif returncode != 0 or not checks:
            status = "error"
        else:
            status = "passed"
    if status in ("error", "timeout"):
        tail = "\n".join(text.splitlines()[-25:])
        reason = f"exit status {returncode}" if status == "error" else f"stopped after its budget of {part.budget_seconds} s"
        summary = f"{reason}; the last lines of parts/{part.name}.log:\n\n```\n{tail}\n```\n\n{summary}".strip()
    return PartResult(part.name, status, seconds, checks, summary, files + [str(log_path.relative_to(out))])


def run_parts(parts: tuple[Part, ...], out: Path, total_budget: float, redo: tuple[str, ...] = (),
              say=print) -> list[PartResult]:
    """Runs every part that has not finished (a saved result with a verdict) or is named in `redo`,
    in order, while the total budget allows its own; returns every part's result, saved or new."""
    results = []
    start = time.perf_counter()
    for part in parts:
        saved = load_result(out, part.name)
        if saved is not None and saved.status in FINISHED and part.name not in redo:
            say(f"{part.name}: {saved.status} in an earlier run, skipped")
            results.append(saved)
            continue
        left = total_budget - (time.perf_counter() - start)
        if part.budget_seconds > left:
            say(f"{part.name}: not run, {left:.0f} s left of the budget and it needs {part.budget_seconds} s; "
                "run the command again to go on")
            results.append(PartResult(part.name, "not run", 0.0, [], "not run: the time budget was spent"))
            continue
        say(f"{part.name}: {part.title} (at most {part.budget_seconds} s) ...")
        result = run_part(part, out)
        save_result(out, result)
        say(f"{part.name}: {result.status} in {result.seconds:.0f} s")
        results.append(result)
    return results


def format_report(parts: tuple[Part, ...], results: list[PartResult], machine: str) -> str:
    titles = {p.name: p.title for p in parts}
    lines = ["# GPU report", "", machine, "",
             "| part | status | seconds | checks passed |", "|---|---|---|---|"]
    for r in results:
        passed = sum(c.ok for c in r.checks)
        lines.append(f"| {r.name} | {r.status} | {r.seconds:.0f} | {passed} of {len(r.checks)} |")
    failed = [f"{r.name}: {c.what}" + (f" ({c.detail})" if c.detail else "")
              for r in results for c in r.checks if not c.ok]
    unfinished = [r.name for r in results if r.status not in ("passed", "failed")]
    lines += ["", f"**{'All checks passed.' if not failed and not unfinished else 'Not all checks passed.'}**"]
    if failed:
        lines += ["", "Failed checks:", ""] + [f"- {f}" for f in failed]
    if unfinished:
        lines += ["", "Parts without a verdict (error, timeout or not run): " + ", ".join(unfinished)]
    for r in results:
        lines += ["", f"## {r.name}: {titles.get(r.name, r.name)}", "", f"Status: {r.status} ({r.seconds:.0f} s)."]
        if r.checks:
            lines += [""] + [f"- {'PASS' if c.ok else 'FAIL'} {c.what}" + (f": {c.detail}" if c.detail else "")
                             for c in r.checks]
        if r.summary:
            lines += ["", r.summary]
        if r.files:
            lines += ["", "Files: " + ", ".join(f"`{f}`" for f in r.files)]
    return "\n".join(lines) + "\n"


def all_passed(results: list[PartResult]) -> bool:
    return all(r.status == "passed" for r in results)

"""A corpus preparation's report: what `build_manifests` writes to `{corpus}_report.json` (per
split the utterances, speakers, hours and words kept; every problem counted by kind and the first
REPORT_PROBLEM_LIMIT listed; the out-of-lexicon words), the message of a preparation stopped on
problems, the report as a console table, and the check that lets a re-run with the same settings
do nothing.
"""

from __future__ import annotations

import json
import os
from collections import Counter, defaultdict
from dataclasses import asdict, dataclass
from pathlib import Path

from asr.data.corpus.manifests import manifest_path

SPLITS = ("train", "dev", "test")  # every recipe writes these; some add more (librispeech: dev_other, ...)
REPORT_PROBLEM_LIMIT = 2000  # problems listed one by one in the report file; all are counted


@dataclass(frozen=True)
class Problem:
    kind: str  # missing_audio, unreadable_audio, missing_transcript, missing_speaker, bad_segment, oov, ...
    item: str  # the utterance, recording or file it concerns
    message: str


def report_path(out_dir: Path, corpus: str) -> Path:
    return Path(out_dir) / f"{corpus}_report.json"


def previous_complete_report(out_dir: Path, corpus: str, settings: dict) -> dict | None:
    """The report of a finished run with the same settings whose manifests all exist, else None."""
    path = report_path(out_dir, corpus)
    if not path.is_file():
        return None
    try:
        report = json.loads(path.read_text())
    except json.JSONDecodeError:
        return None
    if report.get("status") != "complete" or report.get("settings") != _jsonable(settings):
        return None
    for split in report.get("splits", {}):
        for kind in ("recordings", "supervisions", "cuts"):
            if not manifest_path(out_dir, corpus, kind, split).is_file():
                return None
    return report


def build_report(corpus, settings, problems, kept, oov_counts: Counter, out_dir, status) -> dict:
    splits = {}
    by_split: dict[str, list] = defaultdict(list)
    for utterance, _, start, end in kept:
        by_split[utterance.split].append((utterance, end - start))
    for split in ordered_splits(by_split):
        items = by_split[split]
        splits[split] = {
            "utterances": len(items),
            "speakers": len({u.speaker for u, _ in items}),
            "hours": round(sum(d for _, d in items) / 3600, 4),
            "words": sum(len(u.text.split()) for u, _ in items),
        }
    return {
        "corpus": corpus,
        "status": status,
        "out_dir": str(out_dir),
        "settings": _jsonable(settings),
        "splits": splits,
        "problem_counts": dict(sorted(Counter(p.kind for p in problems).items())),
        "oov_words": dict(oov_counts.most_common()),
        "problems": [asdict(p) for p in problems[:REPORT_PROBLEM_LIMIT]],
    }


def failure_message(corpus: str, stopping: list[Problem], out_dir: Path) -> str:
    counts = Counter(p.kind for p in stopping)
    lines = [f"{corpus}: preparation stopped on {len(stopping)} problem(s): "
             + ", ".join(f"{count} {kind}" for kind, count in sorted(counts.items()))]
    for problem in stopping[:10]:
        lines.append(f"  - {problem.message}")
    if len(stopping) > 10:
        lines.append(f"  ... and {len(stopping) - 10} more")
    advice = []
    if "oov" in counts:
        advice.append(
            "words missing from the lexicon: add them to a CMUdict-format file and pass --extra-lexicon FILE, "
            "or pass --oov drop to leave those utterances out"
        )
    if set(counts) - {"oov"}:
        advice.append("missing or unreadable files: restore them, or pass --bad-data drop to leave them out")
    lines.append("What to do: " + "; ".join(advice) + ".")
    lines.append(
        f"The full list is in {report_path(out_dir, corpus)}. Audio converted so far is kept in {out_dir / 'audio'}: "
        "a re-run continues from there."
    )
    return "\n".join(lines)


def format_report(report: dict) -> str:
    """The report as a short table for the console."""
    lines = [f"{report['corpus']}: {report['status']} -> {report['out_dir']}",
             f"{'split':<8}{'utterances':>12}{'speakers':>10}{'hours':>10}{'words':>10}"]
    for split, row in report["splits"].items():
        lines.append(f"{split:<8}{row['utterances']:>12}{row['speakers']:>10}{row['hours']:>10.2f}{row['words']:>10}")
    if report["problem_counts"]:
        lines.append(f"dropped utterances: {report.get('dropped_utterances', 0)}; problems: "
                     + ", ".join(f"{kind} {count}" for kind, count in report["problem_counts"].items()))
    if report["oov_words"]:
        top = list(report["oov_words"].items())[:10]
        lines.append("most frequent out-of-lexicon words: " + ", ".join(f"{w} ({c})" for w, c in top))
    return "\n".join(lines)


def ordered_splits(names) -> list[str]:
    return [s for s in SPLITS if s in names] + sorted(set(names) - set(SPLITS))


def _jsonable(value):
    return json.loads(json.dumps(value, default=str))


def write_json(path: Path, value: dict) -> None:
    partial = path.with_name(path.name + ".partial")
    partial.write_text(json.dumps(value, indent=2) + "\n")
    os.replace(partial, path)

"""Long recordings transcribed per length x attention x mode: PER, lexicon + LM WER, wall-clock,
real-time factor and peak resident memory, as a table, a CSV and a plot.

    python -m asr.benchmarks.longform checkpoint=runs/synth_iclustered/<time>/checkpoints/best.ckpt
    python -m asr.benchmarks.longform checkpoint=best.ckpt recordings=data/longform/synth_dev minutes=[1,10]
    python -m asr.benchmarks.longform checkpoint=best.ckpt attentions=[full,iclustered-64] modes=[onepass] threads=2

Options (key=value):
  checkpoint      the model (required)
  recordings      a set of long recordings, built by `python -m recipes.longform.prepare` (default
                  data/longform/synth_test; its folders <minutes>min/)
  minutes         the lengths to measure (default [1,10,30,60])
  attentions      attention specs as asr.evaluate attention= takes them (default [full,clustered-100,
                  clustered-200,iclustered-100,lsh,linear]; quote a spec with commas:
                  attentions=[full,'iclustered-100:topk=16,bits=32']); lsh needs a model with shared
                  query/key projections and is skipped with a note on others
  modes           pieces (asr.transcribe's default 20-s pieces) and/or onepass (window=none: the whole
                  recording through the encoder at once); default [pieces,onepass]
  wer             true (default): also decode with the model's lexicon and LM (a second transcription
                  in the same process, timed apart: lexicon_wall_s); lexicon=, lm=, lm_weight=,
                  word_score=, beam= as in asr.transcribe
  threads         torch threads of each measurement (default: torch's default)
  timeout         seconds one measurement may take before it is stopped (default 3600)
  max_seconds     skip a row whose estimated wall-clock is above this (default 1800)
  max_memory_gb   skip a row whose estimated peak memory is above this (default: 80% of the RAM)
  out             the folder of longform.csv and longform.png (default asr/results/longform)

Each measurement runs in a child process (asr.benchmarks.longform_measurement), which transcribes
the recording with asr.evaluation.transcription.transcribe and reads its own peak resident memory.
PER is the phone head's greedy hypothesis of the whole recording against the joined phone
references of its utterances (asr.text.metrics.phone_error_rate, as asr.evaluate scores a split);
WER likewise for the lexicon + LM words against the joined transcripts. wall_s is the whole
transcribe() call (loading the model, reading the audio, features, encoder, greedy decoding);
rtf = wall_s / recording seconds.

Rows that would not fit are not run: from the rows measured at shorter lengths (same attention and
mode), time and memory are extrapolated (a power law through the two longest; from one row, time
quadratic in length for full attention in one pass and linear otherwise, memory linear), and a row
over max_seconds or max_memory_gb is written as skipped, saying why; a row longer than one that timed
out is skipped too. Resumable: a row already in the CSV for the same checkpoint, recordings,
settings and machine is not measured again (skipped rows are decided again).
Exit status: 0; 2 for a usage error (a bad option, a missing checkpoint or recording).
"""
from __future__ import annotations

import csv
import hashlib
import json
import math
import os
import platform
import signal
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

import asr
from asr.config.command_line import key_value_config, run_key_value_command
from asr.data.corpus.long_recordings import (SETTINGS_NAME, LongRecordingError, length_folder, minutes_label,
                                             read_long_recording)
from asr.evaluation.evaluation import USAGE_ERRORS

COMMAND = "asr.benchmarks.longform"
ROOT = Path(asr.__file__).resolve().parents[1]
DEFAULT_ATTENTIONS = ["full", "clustered-100", "clustered-200", "iclustered-100", "lsh", "linear"]
# what the child (asr.benchmarks.longform_measurement.mode_settings) runs for each
MODES = {"pieces": "asr.transcribe's default: pieces of at most 20 s with 1 s of context on each side",
         "onepass": "the whole recording through the encoder at once"}
COLUMNS = ["minutes", "attention", "mode", "per", "wer", "wall_s", "rtf", "peak_rss_mb", "machine", "status",
           "recording_seconds", "lexicon_wall_s", "threads", "recordings", "checkpoint", "settings"]


class LongformBenchmarkError(ValueError):
    """A usage error of the benchmark; the message says what to change."""


@dataclass
class LongformBenchmarkConfig:
    checkpoint: Optional[str] = None
    recordings: str = "data/longform/synth_test"
    minutes: list = field(default_factory=lambda: [1, 10, 30, 60])
    attentions: list = field(default_factory=lambda: list(DEFAULT_ATTENTIONS))
    modes: list = field(default_factory=lambda: list(MODES))
    wer: bool = True
    lexicon: Optional[str] = None
    lm: Optional[str] = None
    lm_weight: float = 1.0
    word_score: float = 0.0
    beam: int = 50
    threads: Optional[int] = None
    timeout: float = 3600.0
    max_seconds: float = 1800.0
    max_memory_gb: Optional[float] = None
    out: str = "asr/results/longform"
    progress: bool = True


# ---- the machine ------------------------------------------------------------------------------------
def machine_description() -> str:
    """'<CPU model>, <n> cores, AVX-512' (or AVX2, or neither): what the CSV's machine column says."""
    model, flags = platform.processor() or platform.machine(), set()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            key, _, value = line.partition(":")
            if key.strip() == "model name":
                model = value.strip()
            elif key.strip() == "flags":
                flags = set(value.split())
    except OSError:
        pass
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    vector = "AVX-512" if "avx512f" in flags else "AVX2" if "avx2" in flags else "no AVX2"
    return f"{model}, {cores} cores, {vector}"


def memory_gb() -> float | None:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                return int(line.split()[1]) / 1024 ** 2
    except OSError:
        pass
    return None


# ---- what is measured -------------------------------------------------------------------------------
@dataclass(frozen=True)
class Row:
    minutes: float
    attention: str
    mode: str


def model_facts(config: LongformBenchmarkConfig) -> dict:
    """Checks the checkpoint, the attention specs and (wer=true) the lexicon and LM once, in this
    process, so that usage errors stop the command before any measurement; returns what the
    children need: the phone head and its phone set, and which specs need shared query/key."""
    from asr.evaluation.attention_choice import evaluation_attention
    from asr.evaluation.evaluation import load_model
    from attention_ext import parse_attention_spec

    model = load_model(config.checkpoint)
    phone_head = next((kind for kind, t in model.tokenizers.items() if t.field == "phones"), None)
    phone_set = getattr(model.tokenizers[phone_head], "phone_set", None) if phone_head else None
    needs_shared = {}
    for spec in config.attentions:
        parsed = parse_attention_spec(spec)
        needs_shared[spec] = parsed.needs_shared_qk and not model.encoder.shared_qk
        if not needs_shared[spec]:
            evaluation_attention(model, spec)
    if config.wer:
        from asr.evaluation.decoding.evaluation import settings_from_command
        from asr.evaluation.transcription import TranscribeConfig
        from asr.model.decoding_files import model_decoding_files
        settings_from_command(TranscribeConfig(lexicon=config.lexicon, lm=config.lm, lm_weight=config.lm_weight,
                                               word_score=config.word_score, beam=config.beam),
                              model_decoding_files(config.checkpoint))
    return {"phone_head": phone_head, "phone_set": phone_set, "needs_shared": needs_shared}


def settings_key(config: LongformBenchmarkConfig) -> str:
    """A short hash of what makes a row comparable: the checkpoint file, the recordings as built, and
    the options a measurement runs with (not the lengths, attentions, modes or limits)."""
    checkpoint = Path(config.checkpoint).resolve()
    status = checkpoint.stat()
    built = {}
    for minutes in config.minutes:
        settings = length_folder(config.recordings, minutes) / SETTINGS_NAME
        built[str(minutes)] = settings.read_text() if settings.is_file() else None
    identity = {"checkpoint": [str(checkpoint), status.st_size, status.st_mtime_ns], "recordings": built,
                "wer": config.wer, "lexicon": config.lexicon, "lm": config.lm, "lm_weight": config.lm_weight,
                "word_score": config.word_score, "beam": config.beam, "threads": config.threads}
    return hashlib.sha1(json.dumps(identity, sort_keys=True).encode()).hexdigest()[:12]


def read_rows(path: Path) -> list[dict]:
    if not path.is_file():
        return []
    with open(path, newline="") as handle:
        return list(csv.DictReader(handle))


def write_rows(path: Path, rows: list[dict]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(path.name + ".partial")
    with open(partial, "w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=COLUMNS, extrasaction="ignore")
        writer.writeheader()
        writer.writerows(rows)
    partial.replace(path)


def same_row(stored: dict, row: Row, settings: str, machine: str) -> bool:
    return (stored.get("settings") == settings and stored.get("machine") == machine
            and float(stored["minutes"]) == row.minutes and stored["attention"] == row.attention
            and stored["mode"] == row.mode)


def extrapolated(points: list[tuple[float, float]], length: float, single_exponent: float,
                 exponent_range: tuple[float, float]) -> float:
    """y at `length` from measured (length, y) points: a power law through the two longest (its
    exponent kept in exponent_range), or y ~ length^single_exponent through one."""
    points = sorted(points)
    (x2, y2) = points[-1]
    exponent = single_exponent
    if len(points) >= 2:
        (x1, y1) = points[-2]
        if x1 < x2 and y1 > 0 and y2 > 0:
            exponent = min(max(math.log(y2 / y1) / math.log(x2 / x1), exponent_range[0]), exponent_range[1])
    return y2 * (length / x2) ** exponent


def skip_reason(row: Row, done: list[dict], config: LongformBenchmarkConfig, memory_limit_gb: float | None) -> str:
    """Why `row` is not run ('' to run it), from the rows of its attention and mode measured at
    shorter lengths (done)."""
    shorter = [d for d in done if d["attention"] == row.attention and d["mode"] == row.mode
               and float(d["minutes"]) < row.minutes]
    timed_out = [float(d["minutes"]) for d in shorter if d["status"].startswith("timeout")]
    if timed_out:
        return f"skipped: the {min(timed_out):g}-min row timed out"
    measured = [d for d in shorter if d["status"] == "ok"]
    if not measured:
        return ""
    quadratic = row.attention.strip().lower() == "full" and row.mode == "onepass"
    seconds = extrapolated([(float(d["minutes"]), float(d["wall_s"])) for d in measured], row.minutes,
                           2.0 if quadratic else 1.0, (1.0, 2.0))
    if seconds > config.max_seconds:
        return f"skipped: estimated {seconds:.0f} s > max_seconds={config.max_seconds:g}"
    if memory_limit_gb is not None:
        gigabytes = extrapolated([(float(d["minutes"]), float(d["peak_rss_mb"]) / 1024) for d in measured],
                                 row.minutes, 1.0, (0.0, 2.0))
        if gigabytes > memory_limit_gb:
            return f"skipped: estimated {gigabytes:.1f} GB > max_memory_gb={memory_limit_gb:.1f}"
    return ""


def run_measurement(request: dict, timeout: float) -> tuple[dict | None, str]:
    """(result, 'ok') from a child process, or (None, why it failed: 'timeout after N s', 'failed: ...')."""
    with tempfile.TemporaryDirectory(prefix="longform_") as folder:
        request_path, result_path = Path(folder) / "request.json", Path(folder) / "result.json"
        request_path.write_text(json.dumps(request))
        environment = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
        child = subprocess.Popen([sys.executable, "-m", "asr.benchmarks.longform_measurement", str(request_path),
                                  str(result_path)], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                                 env=environment, start_new_session=True)   # its own group: killed whole on timeout
        try:
            _, errors = child.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(child.pid, signal.SIGKILL)
            child.communicate()
            return None, f"timeout after {timeout:g} s"
        if child.returncode != 0 or not result_path.is_file():
            last = (errors or "").strip().splitlines()[-1:] or [f"exit status {child.returncode}"]
            return None, f"failed: {last[0]}"
        return json.loads(result_path.read_text()), "ok"


def check_config(config: LongformBenchmarkConfig) -> None:
    if not config.checkpoint:
        raise LongformBenchmarkError("give the checkpoint to measure: checkpoint=PATH (a .ckpt file, e.g. "
                                     "runs/<preset>/<time>/checkpoints/best.ckpt)")
    if not Path(config.checkpoint).is_file():
        raise LongformBenchmarkError(f"checkpoint={config.checkpoint}: no such file")
    unknown = [mode for mode in config.modes if mode not in MODES]
    if unknown or not config.modes:
        raise LongformBenchmarkError(f"modes={config.modes}: choose among {', '.join(MODES)}")
    if not config.attentions:
        raise LongformBenchmarkError("attentions=[]: give at least one attention spec")
    try:
        config.minutes = sorted(dict.fromkeys(float(m) for m in config.minutes))
    except (TypeError, ValueError):
        raise LongformBenchmarkError(f"minutes={config.minutes}: give lengths in minutes, e.g. [1,10,30,60]") from None
    if not config.minutes or config.minutes[0] <= 0:
        raise LongformBenchmarkError(f"minutes={config.minutes}: give one or more lengths above 0")
    for name in ("timeout", "max_seconds"):
        if not getattr(config, name) > 0:
            raise LongformBenchmarkError(f"{name}={getattr(config, name)}: give seconds above 0")
    folder = Path(config.recordings)
    corpus_split = folder.name.rpartition("_")
    hint = (f"python -m recipes.longform.prepare --corpus {corpus_split[0] or 'synth'} --split "
            f"{corpus_split[2] or 'test'} --minutes {' '.join(f'{m:g}' for m in config.minutes)} "
            f"--out {folder.parent}")
    for minutes in config.minutes:
        try:
            read_long_recording(length_folder(folder, minutes), hint)
        except LongRecordingError as error:
            raise LongformBenchmarkError(str(error)) from None


# ---- the table and the plot -------------------------------------------------------------------------
def number(value, digits: int, scale: float = 1.0) -> str:
    return "-" if value in (None, "") else f"{float(value) * scale:.{digits}f}"


def format_table(rows: list[dict]) -> str:
    lines = ["| minutes | attention | mode | PER (%) | WER (%) | wall-clock (s) | RTF | peak RSS (MB) | |",
             "|---:|---|---|---:|---:|---:|---:|---:|---|"]
    for row in rows:
        note = "" if row["status"] == "ok" else row["status"]
        lines.append(f"| {float(row['minutes']):g} | {row['attention']} | {row['mode']} | "
                     f"{number(row.get('per'), 2, 100)} | {number(row.get('wer'), 2, 100)} | "
                     f"{number(row.get('wall_s'), 1)} | "
                     f"{number(row.get('rtf'), 4)} | {number(row.get('peak_rss_mb'), 0)} | {note} |")
    return "\n".join(lines)


def plot(rows: list[dict], path: Path, machine: str) -> None:
    """Wall-clock and peak memory against the recording's length, one line per attention x mode."""
    import matplotlib
    import matplotlib.ticker
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    measured = [r for r in rows if r["status"] == "ok"]
    figure, (left, right) = plt.subplots(1, 2, figsize=(12, 4.8))
    for attention, mode in dict.fromkeys((r["attention"], r["mode"]) for r in measured):
        line = sorted((float(r["recording_seconds"]) / 60, float(r["wall_s"]), float(r["peak_rss_mb"]) / 1024)
                      for r in measured if r["attention"] == attention and r["mode"] == mode)
        style = "-" if mode == "onepass" else "--"
        left.plot([p[0] for p in line], [p[1] for p in line], style, marker="o", label=f"{attention}, {mode}")
        right.plot([p[0] for p in line], [p[2] for p in line], style, marker="o", label=f"{attention}, {mode}")
    for axes, label in ((left, "wall-clock (s)"), (right, "peak resident memory (GB)")):
        axes.set_xlabel("recording (minutes)")
        axes.set_ylabel(label)
        axes.set_xscale("log")
        axes.set_yscale("log")
        for axis in (axes.xaxis, axes.yaxis):     # 2, 10, 60 rather than 2x10^0
            axis.set_major_formatter(matplotlib.ticker.FuncFormatter(lambda value, _: f"{value:g}"))
            axis.set_minor_formatter(matplotlib.ticker.FuncFormatter(lambda value, _: f"{value:g}"))
        axes.grid(True, which="both", alpha=0.3)
    if measured:
        left.legend(fontsize=7)
    figure.suptitle(f"Long recordings, per attention and mode ({machine})", fontsize=9)
    figure.tight_layout()
    figure.savefig(path, dpi=120)
    plt.close(figure)


# ---- the command ------------------------------------------------------------------------------------
def run(config: LongformBenchmarkConfig) -> list[dict]:
    check_config(config)
    facts = model_facts(config)
    machine = machine_description()
    settings = settings_key(config)
    memory_limit = config.max_memory_gb if config.max_memory_gb is not None else (
        0.8 * memory_gb() if memory_gb() else None)
    out = Path(config.out)
    csv_path = out / "longform.csv"
    stored = read_rows(csv_path)
    rows = [Row(minutes, attention, mode) for minutes in config.minutes for attention in config.attentions
            for mode in config.modes]
    from tqdm.auto import tqdm
    results: list[dict] = []
    bar = tqdm(rows, desc="longform", unit="row", disable=not config.progress)
    for row in bar:
        previous = next((s for s in stored if same_row(s, row, settings, machine)
                         and (s["status"] == "ok" or s["status"] == f"timeout after {config.timeout:g} s")), None)
        if previous is not None:
            results.append(previous)
            continue
        bar.set_description(f"{minutes_label(row.minutes)} {row.attention} {row.mode}")
        folder = length_folder(config.recordings, row.minutes)
        record = {"minutes": row.minutes, "attention": row.attention, "mode": row.mode, "machine": machine,
                  "threads": config.threads or "", "recordings": str(folder), "settings": settings,
                  "checkpoint": str(Path(config.checkpoint).resolve()),
                  "recording_seconds": read_long_recording(folder).duration}
        if facts["needs_shared"][row.attention]:
            record["status"] = "skipped: needs a model with shared query/key projections (model.shared_qk)"
        else:
            record["status"] = skip_reason(row, results, config, memory_limit)
        if not record["status"]:
            request = {"checkpoint": config.checkpoint, "recording": str(folder), "attention": row.attention,
                       "mode": row.mode, "threads": config.threads, "phone_head": facts["phone_head"],
                       "phone_set": facts["phone_set"], "wer": config.wer,
                       "decoding": {"lexicon": config.lexicon, "lm": config.lm, "lm_weight": config.lm_weight,
                                    "word_score": config.word_score, "beam": config.beam}}
            result, record["status"] = run_measurement(request, config.timeout)
            record.update(result or {})
        results.append(record)
        tqdm.write(format_table([record]).splitlines()[-1])
        kept = [s for s in stored if not any(same_row(s, Row(float(r["minutes"]), r["attention"], r["mode"]),
                                                      settings, machine) for r in results)]
        write_rows(csv_path, kept + results)      # after every row: an interrupted run resumes from here
    bar.close()
    print(format_table(results))
    print(f"(machine: {machine}; torch threads per measurement: {config.threads or 'default'}; "
          f"settings {settings})")
    plot(results, out / "longform.png", machine)
    print(f"written: {csv_path}, {out / 'longform.png'}")
    return results


def parse_arguments(argv: list[str]) -> LongformBenchmarkConfig:
    return key_value_config(LongformBenchmarkConfig, argv, LongformBenchmarkError, noun="options")


def main(argv: list[str] | None = None) -> int:
    return run_key_value_command(COMMAND, __doc__, lambda arguments: run(parse_arguments(arguments)) and None, argv,
                                 usage_errors=(LongformBenchmarkError, *USAGE_ERRORS),
                                 resume_hint="run the same command again: measured rows are kept")


if __name__ == "__main__":
    sys.exit(main())

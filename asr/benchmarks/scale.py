"""How the data side grows with the data: start-up, memory, feature cache and batch rate from 10 h to 100,000 h.

    python -m asr.benchmarks.scale [--source data/synth] [--scratch runs/scale_benchmark]
                                   [--hours 10 100 1000 10000 100000] [--batches 200] [--memory-limit-gb 12]
                                   [--modes precomputed on_the_fly streaming] [--eager-max-hours 10000]

Three modes: the eager path with precomputed features and with features on the fly, and the
streaming path (`data.streaming=true`, asr/data/batching/stream_sampler.py). For the streaming mode each size
is a stream of its own (asr.benchmarks.scaled_corpus.replicate_stream: the source's shards, prepared once
into `--scratch/base` and timed, repeated under new ids with their frames hard-linked and their
records rewritten; no manifest beside it, so only the shards are read; what the largest sizes take
to write: asr/RESULTS.md, "Scale, round 2"). The eager modes run only up to --eager-max-hours (their
memory grows linearly with the hours). "x model" is batches/s times --model-step-s, the demo model's step.

For each size it writes, under `--scratch/<hours>h/`, a training manifest of that many hours made
of the source corpus's training cuts under new ids (asr.benchmarks.scaled_corpus: no audio is written)
and a dev manifest (the source's dev cuts), and gives the copies their feature cache (the source's
shards hard-linked under the new ids: the frames are those computing them would give; the disk
size is counted per copy). Then, each in a fresh process (so each peak is its own):

  startup_s     SpeechDataModule(...).setup("fit") and the first training batch: the training path
                (manifest loading, checks, tokenisers and targets, feature cache, statistics), with
                precomputed features (the cache above; the statistics file deleted first, so they
                are computed as in the first run) and with features on the fly (measured second: the
                statistics file the first wrote is reused - computing it from the audio costs what
                computing the sample's features costs, once);
  peak_rss_mb   the process's peak resident memory (getrusage ru_maxrss), and `data_rss_mb`: that
                less the peak right after the imports (what the data side added);
  batches_per_s training batches after the first one (up to --batches or --seconds), SpecAugment on,
                num_workers=0, as in training; `epoch_s` = the sampler's batches per epoch / that
                rate (extrapolated unless the epoch was drawn whole: `epoch_measured`).
The cache build time is measured once, on the source's training cuts (`--source`, computed into
`--scratch/base`), and extrapolated to each size by its hours (marked "extrap." in the table).

A size whose process grows past --memory-limit-gb or runs past --time-limit is stopped and reported
as such (no swap here: the limit keeps the machine's other jobs alive). Prints a table; writes scale.csv, scale.json and
scale.png (log-log, with a line of linear growth) into --scratch (or --out). Delete --scratch
afterwards: the 10,000 h manifest is ~1 GB.
"""
from __future__ import annotations

import argparse
import csv
import json
import resource
import subprocess
import sys
import time
from pathlib import Path

from asr.core.exit_status import run_command

CORPUS = "scale"    # manifests {folder}/scale_cuts_{train,dev}.jsonl.gz
MODES = ("precomputed", "on_the_fly", "streaming")
EAGER_MODES = ("precomputed", "on_the_fly")


class BadArguments(ValueError):
    """A source folder without the manifests, or a scratch folder that cannot be written."""


def peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0   # Linux: kilobytes


def data_config(folder: Path, mode: str, max_duration: float):
    from asr.data.config import DataConfig

    return DataConfig(corpus=CORPUS, root=str(folder), targets=["phones", "chars"],
                      precompute_features=mode != "on_the_fly", cache_dir=str(folder / "features"),
                      max_duration=max_duration, num_workers=0, progress=False, streaming=mode == "streaming")


def measure(folder: Path, mode: str, max_duration: float, batches: int, seconds: float) -> dict:
    """One size, one mode, in this process (a fresh one: run by `run_measurement`)."""
    import torch
    from asr.data.datamodule import SpeechDataModule

    torch.set_num_threads(1)
    baseline = peak_rss_mb()
    start = time.perf_counter()
    module = SpeechDataModule(data_config(folder, mode, max_duration))
    phases = {}
    module.split(module.cfg.train_split, features=False)
    module.split(module.cfg.dev_split, features=False)
    phases["load_check_tokenise_s"] = time.perf_counter() - start
    module.setup("fit")
    phases["features_and_stats_s"] = time.perf_counter() - start - phases["load_check_tokenise_s"]
    loader = module.train_dataloader()
    iterator = iter(loader)
    next(iterator)
    startup = time.perf_counter() - start
    phases["sampler_first_batch_s"] = startup - sum(phases.values())
    drawn, exhausted = 0, False
    begin = time.perf_counter()
    while drawn < batches and time.perf_counter() - begin < seconds:
        try:
            next(iterator)
        except StopIteration:
            exhausted = True
            break
        drawn += 1
    elapsed = time.perf_counter() - begin
    rate = drawn / elapsed if drawn else float("nan")
    per_epoch = loader.sampler.estimated_batches()
    train = module.split(module.cfg.train_split)
    return {"mode": mode, "utterances": train.utterances, "hours": train.hours, "startup_s": startup, **phases,
            "peak_rss_mb": peak_rss_mb(), "baseline_rss_mb": baseline, "data_rss_mb": peak_rss_mb() - baseline,
            "batches_per_s": rate, "batches_per_epoch": per_epoch,
            "epoch_s": elapsed if exhausted else per_epoch / rate, "epoch_measured": exhausted}


def run_measurement(folder: Path, mode: str, args: argparse.Namespace) -> dict:
    """`measure` in a fresh process, stopped if its resident memory passes --memory-limit-gb."""
    command = [sys.executable, "-m", "asr.benchmarks.scale", "--measure", str(folder), "--mode", mode,
               "--batches", str(args.batches), "--seconds", str(args.seconds),
               "--max-duration", str(args.max_duration)]
    if mode == "precomputed":   # the first run after the cache is built: its statistics are computed too
        for stats in folder.glob("features/*/train/stats-*.json"):
            stats.unlink()
    process = subprocess.Popen(command, stdout=subprocess.PIPE, text=True)
    limit_kb, over, late, started = args.memory_limit_gb * 1024 * 1024, 0.0, 0.0, time.perf_counter()
    while process.poll() is None:
        rss_kb = _resident_kb(process.pid)
        if rss_kb > limit_kb:
            over = rss_kb / 1024.0
            process.kill()
        elif time.perf_counter() - started > args.time_limit:
            late = _resident_kb(process.pid, "VmHWM:") / 1024.0
            process.kill()
        time.sleep(0.2)
    output = process.stdout.read()
    if over:
        return {"mode": mode, "stopped": f"resident memory passed {args.memory_limit_gb:g} GB ({over:.0f} MB)"}
    if late:
        return {"mode": mode, "stopped": f"ran past {args.time_limit:g} s (peak {late:.0f} MB by then)"}
    if process.returncode != 0:
        return {"mode": mode, "stopped": f"exit status {process.returncode}"}
    return json.loads(output.strip().splitlines()[-1])


def _resident_kb(pid: int, field: str = "VmRSS:") -> int:
    try:
        with open(f"/proc/{pid}/status") as status:
            for line in status:
                if line.startswith(field):
                    return int(line.split()[1])
    except OSError:
        pass
    return 0


def prepare_size(hours: float, source: Path, scratch: Path, base: dict) -> dict:
    """The manifests and feature cache of one size (reused when a previous run wrote them)."""
    from asr.data.features.feature_cache import feature_directory
    from asr.data.features.features import FilterBank
    from asr.data.corpus.manifests import cuts_path
    from asr.benchmarks.scaled_corpus import replicate_feature_cache, write_scaled_cuts

    folder = scratch / f"{hours:g}h"
    done = folder / "prepared.json"
    if done.is_file():
        return json.loads(done.read_text())
    folder.mkdir(parents=True, exist_ok=True)
    start = time.perf_counter()
    train = write_scaled_cuts(cuts_path(source, "synth", "train"), cuts_path(folder, CORPUS, "train"), hours, source)
    manifest_s = time.perf_counter() - start
    # dev: the source's dev cuts once (a hair less than their hours: one copy, whatever the rounding)
    dev = write_scaled_cuts(cuts_path(source, "synth", "dev"), cuts_path(folder, CORPUS, "dev"),
                            base["dev_hours"] * (1 - 1e-9), source)
    cache = feature_directory(folder / "features", FilterBank(40))
    cache_bytes = replicate_feature_cache(Path(base["cache"]) / "train", cache / "train", train, base["train_ids"])
    replicate_feature_cache(Path(base["cache"]) / "dev", cache / "dev", dev, base["dev_ids"])
    prepared = {"hours": hours, "folder": str(folder), "utterances": train.cuts, "audio_hours": train.seconds / 3600,
                "manifest_mb": cuts_path(folder, CORPUS, "train").stat().st_size / 2**20,
                "manifest_write_s": manifest_s, "cache_gb": cache_bytes / 2**30}
    done.write_text(json.dumps(prepared))
    return prepared


def prepare_stream_base(source: Path, scratch: Path, shard_cuts: int) -> dict:
    """The source's training and dev splits prepared as streams once (timed: the preparation rate)."""
    from asr.data.features.feature_cache import feature_directory
    from asr.data.features.features import FilterBank
    from asr.data.corpus.manifests import cuts_path
    from asr.data.streaming.stream_preparation import prepare_stream
    from asr.data.streaming.stream_shards import stream_folder

    done = scratch / "base" / f"stream-{shard_cuts}.json"
    if done.is_file():
        return json.loads(done.read_text())
    cache = feature_directory(scratch / "base" / f"stream-{shard_cuts}", FilterBank(40))
    start = time.perf_counter()
    train = prepare_stream(cuts_path(source, "synth", "train"), source.resolve(), stream_folder(cache / "train"),
                           FilterBank(40), shard_cuts, description="shards train")
    seconds = time.perf_counter() - start
    prepare_stream(cuts_path(source, "synth", "dev"), source.resolve(), stream_folder(cache / "dev"), FilterBank(40),
                   shard_cuts, progress=False)
    base = {"cache": str(cache), "prepare_seconds": seconds, "prepare_seconds_per_hour": seconds / train.hours}
    done.write_text(json.dumps(base))
    return base


def prepare_stream_size(hours: float, scratch: Path, base: dict, shard_cuts: int) -> dict:
    """A streamed corpus of `hours` (asr.benchmarks.scaled_corpus.replicate_stream), in a folder of its own
    without manifests (so the streaming path reads only its shards); reused when already written."""
    from asr.benchmarks.scaled_corpus import replicate_stream
    from asr.data.streaming.stream_shards import stream_folder

    folder = scratch / f"{hours:g}h-stream-{shard_cuts}"
    done = folder / "prepared.json"
    if done.is_file():
        return json.loads(done.read_text())
    key = Path(base["cache"]).name
    cache = folder / "features" / key
    start = time.perf_counter()
    index = replicate_stream(stream_folder(Path(base["cache"]) / "train"), stream_folder(cache / "train"), hours)
    seconds = time.perf_counter() - start
    replicate_stream(stream_folder(Path(base["cache"]) / "dev"), stream_folder(cache / "dev"), 1e-9)
    (cache / "options.json").write_text((Path(base["cache"]) / "options.json").read_text())
    shards = stream_folder(cache / "train")
    frames_bytes = sum(p.stat().st_size for p in shards.glob("shard-*.lilcom"))   # counted per copy, linked or not
    records_bytes = sum(p.stat().st_size for p in shards.glob("shard-*.cuts.jsonl.gz"))
    prepared = {"hours": hours, "folder": str(folder), "utterances": index["cuts"], "audio_hours": index["seconds"] / 3600,
                "shards": index["shards"], "shards_gb": (frames_bytes + records_bytes) / 2**30,
                "records_gb": records_bytes / 2**30, "replicate_s": seconds}
    done.write_text(json.dumps(prepared))
    return prepared


def prepare_base(source: Path, scratch: Path) -> dict:
    """The source's features computed once into `scratch/base` (timed: the cache build rate)."""
    from asr.data.features.feature_cache import feature_directory, precompute_features
    from asr.data.features.features import FilterBank
    from asr.data.corpus.manifests import ManifestError, load_cuts

    done = scratch / "base" / "base.json"
    if done.is_file():
        return json.loads(done.read_text())
    try:
        train = load_cuts(source.resolve(), "synth", "train", need_phones=True)
        dev = load_cuts(source.resolve(), "synth", "dev", need_phones=True)
    except ManifestError as error:
        raise BadArguments(str(error)) from None
    cache = feature_directory(scratch / "base" / "features", FilterBank(40))
    start = time.perf_counter()
    _, failures = precompute_features(list(train), FilterBank(40), cache / "train", progress=True)
    seconds = time.perf_counter() - start
    precompute_features(list(dev), FilterBank(40), cache / "dev", progress=False)
    if failures:
        raise BadArguments(f"{len(failures)} source utterances have unreadable audio; regenerate {source}")
    hours = sum(c.duration for c in train) / 3600
    # the manifest's id order: the last, partial copy of a scaled split takes the first cuts
    base = {"cache": str(cache), "train_ids": [c.id for c in train], "dev_ids": [c.id for c in dev],
            "train_hours": hours, "dev_hours": sum(c.duration for c in dev) / 3600,
            "cache_seconds": seconds, "cache_seconds_per_hour": seconds / hours}
    done.write_text(json.dumps(base))
    return base


COLUMNS = [("hours", "hours", "{:g}"), ("utterances", "utterances", "{:,}"),
           ("startup_s", "start-up s", "{:.1f}"), ("data_rss_mb", "data MB", "{:.0f}"),
           ("peak_rss_mb", "peak MB", "{:.0f}"), ("batches_per_s", "batches/s", "{:.1f}"),
           ("ahead_of_model", "x model", "{:.0f}"), ("epoch_s", "epoch s", "{:.0f}")]
MODE_TITLES = {"precomputed": "eager, precomputed features", "on_the_fly": "eager, features on the fly",
               "streaming": "streaming (data.streaming=true), features in the shards"}


def table(rows: list[dict], model_step_s: float) -> str:
    lines = []
    for mode in MODES:
        lines.append(f"\n{MODE_TITLES[mode]}")
        lines.append("  ".join(f"{label:>11s}" for _, label, _ in COLUMNS))
        for row in rows:
            result = row[mode]
            if "stopped" in result:
                lines.append(f"{row['hours']:>11g}  {result['stopped']}")
                continue
            values = {**row, **result, "ahead_of_model": result["batches_per_s"] * model_step_s}
            cells = [fmt.format(values[key]) + ("*" if key == "epoch_s" and not values["epoch_measured"] else "")
                     for key, _, fmt in COLUMNS]
            lines.append("  ".join(f"{cell:>11s}" for cell in cells))
    lines.append(f"x model: batches/s x the demo model's step ({model_step_s:g} s, --model-step-s): how far the "
                 "loader is ahead of training")
    lines.append("* epoch s: batches per epoch / batches per s (extrapolated from the batches drawn)")
    eager = [row for row in rows if "cache_gb" in row]
    if eager:
        lines.append("\neager feature cache    size GB   build s (extrap.)   manifest MB")
        for row in eager:
            lines.append(f"  {row['hours']:>8g} h  {row['cache_gb']:14.2f}  {row['cache_build_s']:18.0f}  "
                         f"{row['manifest_mb']:12.1f}")
    streamed = [row for row in rows if "stream" in row]
    if streamed:
        lines.append("\nstreaming shards       shards   size GB (records GB)   preparation s (extrap.)")
        for row in streamed:
            stream = row["stream"]
            lines.append(f"  {row['hours']:>8g} h  {stream['shards']:9,d}  {stream['shards_gb']:9.2f} "
                         f"({stream['records_gb']:.2f})  {stream['prepare_s']:22.0f}")
    return "\n".join(lines)


def write_outputs(rows: list[dict], out: Path) -> None:
    flat = [{"hours": row["hours"], "mode": mode, "utterances": row.get("utterances"), "cache_gb": row.get("cache_gb"),
             "cache_build_s": row.get("cache_build_s"), **row[mode]} for row in rows for mode in MODES]
    (out / "scale.json").write_text(json.dumps(rows, indent=1))
    keys = sorted({key for record in flat for key in record}, key=lambda k: (k != "hours", k != "mode", k))
    with open(out / "scale.csv", "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=keys)
        writer.writeheader()
        writer.writerows(flat)
    plot(rows, out / "scale.png")


def plot(rows: list[dict], path: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(1, 3, figsize=(15, 4.5))
    panels = [("startup_s", "start-up to the first batch (s)"), ("data_rss_mb", "data-side peak memory (MB)"),
              ("epoch_s", "epoch without the model (s)")]
    for ax, (key, title) in zip(axes, panels):
        anchor = None
        for mode in MODES:
            points = [(row["hours"], row[mode][key]) for row in rows if key in row.get(mode, {})]
            if points:
                ax.plot(*zip(*points), "o-", label=mode.replace("_", " "))
                anchor = anchor or points[0]
        if anchor:
            hours = [row["hours"] for row in rows]
            ax.plot(hours, [anchor[1] * h / anchor[0] for h in hours], "k--", lw=1, label="linear growth")
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel("hours of training audio")
        ax.set_title(title)
        ax.grid(True, which="both", alpha=0.3)
        ax.legend()
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)


def benchmark(args: argparse.Namespace) -> None:
    source, scratch = Path(args.source), Path(args.scratch)
    out = Path(args.out) if args.out else scratch
    try:
        scratch.mkdir(parents=True, exist_ok=True)
        out.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        raise BadArguments(f"cannot create {error.filename}: {error.strerror}; give --scratch/--out folders you can write") from None
    base = prepare_base(source, scratch)
    print(f"source: {len(base['train_ids'])} training utterances, {base['train_hours']:.2f} h; its feature cache "
          f"took {base['cache_seconds']:.1f} s ({base['cache_seconds_per_hour']:.1f} s per hour of audio)", flush=True)
    stream_base = prepare_stream_base(source, scratch, args.shard_cuts) if "streaming" in args.modes else None
    rows = []
    for hours in args.hours:
        eager = hours <= args.eager_max_hours and any(mode in EAGER_MODES for mode in args.modes)
        row = prepare_size(hours, source, scratch, base) if eager else {"hours": hours}
        if eager:
            row["cache_build_s"] = base["cache_seconds_per_hour"] * row["audio_hours"]   # extrapolated by hours
        if stream_base is not None:
            row["stream"] = prepare_stream_size(hours, scratch, stream_base, args.shard_cuts)
            row["stream"]["prepare_s"] = stream_base["prepare_seconds_per_hour"] * row["stream"]["audio_hours"]
            row.setdefault("utterances", row["stream"]["utterances"])
        if args.prepare_only:
            print(f"  {hours:g} h prepared", flush=True)
            continue
        for mode in MODES:
            if mode not in args.modes:
                row[mode] = {"mode": mode, "stopped": "not asked for (--modes)"}
            elif mode in EAGER_MODES and not eager:
                row[mode] = {"mode": mode, "stopped": f"not run above --eager-max-hours {args.eager_max_hours:g} "
                                                      "(its memory grows linearly with the hours)"}
            else:
                folder = Path(row["stream"]["folder"] if mode == "streaming" else row["folder"])
                row[mode] = run_measurement(folder, mode, args)
                print(f"  {hours:g} h {mode}: {json.dumps(row[mode])}", flush=True)
        rows.append(row)
        write_outputs(rows, out)
    if rows:
        print(table(rows, args.model_step_s))
    print(f"\nwritten: {out / 'scale.csv'}, {out / 'scale.json'}, {out / 'scale.png'}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m asr.benchmarks.scale", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--source", default="data/synth", help="a prepared synth corpus (recipes.synth)")
    parser.add_argument("--scratch", default="runs/scale_benchmark", help="where the scaled manifests go (1 GB a 10,000 h)")
    parser.add_argument("--out", default=None, help="where scale.csv/json/png go (default: --scratch)")
    parser.add_argument("--hours", type=float, nargs="+", default=[10, 100, 1000, 10000, 100000])
    parser.add_argument("--batches", type=int, default=200, help="batches timed after the first one")
    parser.add_argument("--seconds", type=float, default=30.0, help="at most this long timing batches")
    parser.add_argument("--max-duration", type=float, default=60.0, help="data.max_duration (synth's 60 s)")
    parser.add_argument("--memory-limit-gb", type=float, default=12.0)
    parser.add_argument("--time-limit", type=float, default=1800.0, help="seconds a size and mode may take")
    parser.add_argument("--modes", nargs="+", choices=MODES, default=list(MODES))
    parser.add_argument("--eager-max-hours", type=float, default=10000,
                        help="the eager modes only up to this size (100,000 h would need ~125 GB)")
    parser.add_argument("--shard-cuts", type=int, default=1000, help="data.stream_shard_cuts of the streamed sizes")
    parser.add_argument("--model-step-s", type=float, default=0.38,
                        help="the demo model's training step in seconds, for the 'x model' column (asr/RESULTS.md)")
    parser.add_argument("--prepare-only", action="store_true", help="write the manifests and caches, measure nothing")
    parser.add_argument("--measure", default=None, help=argparse.SUPPRESS)   # a child: one size, one mode
    parser.add_argument("--mode", choices=MODES, default="precomputed", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.measure:
        print(json.dumps(measure(Path(args.measure), args.mode, args.max_duration, args.batches, args.seconds)))
        return 0
    if any(hours <= 0 for hours in args.hours) or args.batches < 1 or args.memory_limit_gb <= 0:
        print("asr.benchmarks.scale: error: --hours, --batches and --memory-limit-gb must be positive", file=sys.stderr)
        return 2
    return run_command("asr.benchmarks.scale", lambda: benchmark(args), usage_errors=(BadArguments,))


if __name__ == "__main__":
    sys.exit(main())

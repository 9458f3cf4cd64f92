"""Which augmentation carries synthetic training to real voices: the ablation (recipes/asterisk/RESULTS.md).

    python -m recipes.asterisk.ablation                       # every row, the demo's step budget
    python -m recipes.asterisk.ablation --steps 3000 --rows specaugment all
    python -m recipes.asterisk.ablation --publish recipes/asterisk   # also copy RESULTS' table and PNG

Trains the demo preset (`synth_iclustered`) once per row, each for the same number of optimiser steps
(a step budget: a busy machine decides nothing), into <out>/<row>/, changing only the augmentation
(`data.augment`, SpecAugment, or the corpus's voices), then scores every model on

    synth test PER          the built-in corpus's test split (data/synth, for every row)
    asterisk dev PER        real speech, the half for choosing (recipes/asterisk)
    asterisk test PER       real speech, the half for reporting
    asterisk test WER       lexicon + LM decoding: the synthetic corpus's lexicon and trigram, the
                            asterisk words added to the lexicon (their LM probability is <unk>'s)

all from the row's final weights (checkpoints/last.ckpt, the same step for every row: the best
checkpoint by validation would be an earlier step for rows whose epochs end sooner), and the
seconds per training step (training time / steps of the run, with the load average it ran
under: a number to compare only between rows run on a quiet machine). Writes <out>/ablation.md (the
table), ablation.json and ablation.png.

Rows (each "+ X" is SpecAugment plus X alone, so a row shows what X adds):

    none         no augmentation at all
    specaugment  SpecAugment only: the demo preset before this issue
    speed        + 3-way speed perturbation 0.9 / 1.0 / 1.1
    reverb       + simulated rooms for half the utterances
    noise        + noise (coloured, babble) for half the utterances at 10-20 dB SNR
    channel      + channel effects (band limits, telephone, codecs) and level for half the utterances
    voices       + the festival voices in the corpus (a corpus of its own: data/synth_voices)
    all          all of the above
    speakers     today's default (the channel row) + other speakers made by formant and pitch
                 shifts (Praat's Change gender) for half the utterances
    vtlp         today's default (the channel row) + vocal tract length perturbation of the
                 features (alpha 0.8-1.25) for half the utterances
    piper25      today's default + piper's neural voice for a quarter of the seen speakers'
                 utterances (a corpus of its own: data/synth_piper25); piper50: half (data/synth_piper50)
    together41   "the best together": today's default + speakers, VTLP and piper 25 % at once
                 (none of them alone beat the default on asterisk dev; this row says whether together they do)

Run it again after an interruption: finished rows are skipped, an interrupted one resumes from its last
finished epoch, and evaluations already written are reused. The table accumulates: rows found in an
earlier <out>/ablation.json and not asked for now are kept as they were measured (with their own load
column), so the table can be finished in parts, e.g. on another machine from the published json
copied into <out>.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import time
from pathlib import Path

from asr.core.exit_status import SUCCESS, USAGE_ERROR, run_command
from recipes.child_run import run_to_end

PRESET = "synth_iclustered"
DEFAULT_STEPS = 2000   # the demo's step budget (conf/trainer/synth.yaml)
SPEED = "data.augment.speed=[0.9,1.0,1.1]"
REVERB = "data.augment.reverb_prob=0.5"
NOISE = "data.augment.noise_prob=0.5"
CHANNEL = ("data.augment.channel_prob=0.5", "data.augment.volume_prob=0.5")
VOICES = ("synth_corpus.extra_voices=festival", "data.root=data/synth_voices")
SPEAKERS = "data.augment.speaker_prob=0.5"   # the ranges are data.augment's defaults (asr/docs/data.md)
VTLP = "data.augment.vtlp_prob=0.5"
# piper's neural voice speaks a share of the seen speakers' utterances (corpora of their own)
PIPER_25 = ("synth_corpus.extra_voices=piper", "synth_corpus.piper_share=0.25", "data.root=data/synth_piper25")
PIPER_50 = ("synth_corpus.extra_voices=piper", "synth_corpus.piper_share=0.5", "data.root=data/synth_piper50")
ROWS: dict[str, tuple[str, tuple[str, ...]]] = {
    "none": ("no augmentation", ("data.specaugment=false",)),
    "specaugment": ("SpecAugment only (before this issue)", ()),
    "speed": ("+ speed 0.9/1.0/1.1", (SPEED,)),
    "reverb": ("+ rooms (p 0.5)", (REVERB,)),
    "noise": ("+ noise 10-20 dB (p 0.5)", (NOISE,)),
    "channel": ("+ channel and level (p 0.5)", CHANNEL),
    "voices": ("+ festival voices", VOICES),
    "all": ("all together", (SPEED, REVERB, NOISE, *CHANNEL, *VOICES)),
    "speakers": ("channel and level + formant/pitch speakers (p 0.5)", (*CHANNEL, SPEAKERS)),
    "vtlp": ("channel and level + VTLP 0.8-1.25 (p 0.5)", (*CHANNEL, VTLP)),
    "piper25": ("channel and level + neural voice (piper, 25 %)", (*CHANNEL, *PIPER_25)),
    "piper50": ("channel and level + neural voice (piper, 50 %)", (*CHANNEL, *PIPER_50)),
    "together41": ("channel and level + speakers, VTLP and neural voice (piper, 25 %) together",
                   (*CHANNEL, SPEAKERS, VTLP, *PIPER_25)),
}
# Every row starts from the demo as it was before this issue (SpecAugment only), whatever the preset's
# defaults are now (they follow this table: channel and level are on in the synth presets).
BEFORE = ("data.augment.channel_prob=0.0", "data.augment.volume_prob=0.0")


def row_overrides(row: str) -> list[str]:
    """BEFORE with the row's own overrides on top: the asr.train overrides that train the row."""
    values = dict(override.split("=", 1) for override in BEFORE)
    values.update(override.split("=", 1) for override in ROWS[row][1])
    return [f"{key}={value}" for key, value in values.items()]


REAL_SPEECH = "asterisk"
REAL_SPEECH_ROOT = Path("data/asterisk")   # prepared there on first use, as asr.evaluate does
SYNTH_ROOT = Path("data/synth")           # the demo's corpus: its test split scores every row
COLUMNS = ("synth test PER", "asterisk dev PER", "asterisk test PER", "asterisk test WER (lexicon + LM)",
           "s/step", "load")


def train_row(row: str, run_dir: Path, steps: int, extra: list[str]) -> int:
    """Trains (or resumes) one row with `python -m asr.train`; returns its exit status."""
    command = [sys.executable, "-m", "asr.train", f"conf={PRESET}", f"run_dir={run_dir}",
               "trainer.max_minutes=null", f"trainer.max_steps={steps}", "trainer.max_epochs=-1",
               "test=false", *row_overrides(row), *extra]   # scored below, from the final weights
    if (run_dir / "checkpoints" / "last.ckpt").is_file():
        command.append(f"ckpt_path={run_dir / 'checkpoints' / 'last.ckpt'}")
    print(f"[ablation] {row}: {' '.join(command[2:])}", flush=True)
    load_before = os.getloadavg()[0]
    status = run_to_end(command)
    if status == SUCCESS:
        (run_dir / "load.json").write_text(json.dumps({"before": load_before, "after": os.getloadavg()[0]}) + "\n")
    return status


def evaluate_split(run_dir: Path, corpus: str, root: Path, split: str, decoder: str) -> dict:
    """Scores the row's final weights (checkpoints/last.ckpt: every row at the same step) on a split
    (cached in the run folder)."""
    out = run_dir / "evaluations" / f"{corpus}_{split}_last"
    if not (out / "results.json").is_file():
        from asr import evaluate
        arguments = [f"checkpoint={run_dir / 'checkpoints' / 'last.ckpt'}", f"data.corpus={corpus}", f"data.root={root}",
                     f"split={split}", f"decoder={decoder}", f"out={out}"]
        if decoder == "lexicon":
            arguments.append(f"extra_lexicon={root / 'lexicon.txt'}")
        code = evaluate.main(arguments)
        if code != SUCCESS:
            raise RuntimeError(f"asr.evaluate of {run_dir} on {corpus} {split} ended with status {code}")
    return json.loads((out / "results.json").read_text())


def row_results(row: str, run_dir: Path) -> dict:
    run = json.loads((run_dir / "results.json").read_text())
    # every row is scored on the default corpus's test split (the voices rows train on a corpus of their own)
    synth = evaluate_split(run_dir, "synth", SYNTH_ROOT, "test", "greedy")
    dev = evaluate_split(run_dir, REAL_SPEECH, REAL_SPEECH_ROOT, "dev", "lexicon")
    test = evaluate_split(run_dir, REAL_SPEECH, REAL_SPEECH_ROOT, "test", "lexicon")
    train_seconds = sum(epoch["train_seconds"] for epoch in run.get("epoch_times", []))
    load = json.loads((run_dir / "load.json").read_text()) if (run_dir / "load.json").is_file() else {}
    return {"row": row, "description": ROWS[row][0], "overrides": list(ROWS[row][1]), "steps": run["steps"],
            "synth_test_per": synth["error_rates"]["per"], "asterisk_dev_per": dev["error_rates"]["per"],
            "asterisk_test_per": test["error_rates"]["per"], "asterisk_test_wer": test["error_rates"]["wer_lexicon"],
            "asterisk_test_oov_lm": test["out_of_vocabulary"]["lm"],
            "seconds_per_step": train_seconds / run["steps"] if run["steps"] else None,
            "load_average": max(load.values()) if load else None}


def earlier_rows(path: Path, exclude: list[str], steps: int) -> list[dict]:
    """Rows of an earlier run's ablation.json that are not being (re)measured now, trained for the same
    number of steps (a row of another budget would not compare)."""
    if not path.is_file():
        return []
    return [r for r in json.loads(path.read_text())
            if r["row"] in ROWS and r["row"] not in exclude and r["steps"] == steps]


def format_table(results: list[dict]) -> str:
    def pct(value):
        return "-" if value is None else f"{100 * value:.1f}"
    lines = ["| row | " + " | ".join(COLUMNS) + " |", "|---|" + "---:|" * len(COLUMNS)]
    for r in results:
        lines.append(f"| {r['description']} | {pct(r['synth_test_per'])} | {pct(r['asterisk_dev_per'])} | "
                     f"{pct(r['asterisk_test_per'])} | {pct(r['asterisk_test_wer'])} | "
                     f"{'-' if r['seconds_per_step'] is None else format(r['seconds_per_step'], '.2f')} | "
                     f"{'-' if r['load_average'] is None else format(r['load_average'], '.1f')} |")
    return "\n".join(lines) + "\n"


def plot(results: list[dict], path: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    names = [r["row"] for r in results]
    series = [("synth test PER", "synth_test_per"), ("asterisk dev PER", "asterisk_dev_per"),
              ("asterisk test PER", "asterisk_test_per"), ("asterisk test WER (lexicon + LM)", "asterisk_test_wer")]
    figure, axis = plt.subplots(figsize=(9, 4.5))
    width = 0.8 / len(series)
    for i, (label, key) in enumerate(series):
        values = [100 * r[key] for r in results]
        axis.bar([x + (i - (len(series) - 1) / 2) * width for x in range(len(names))], values, width, label=label)
    axis.set_xticks(range(len(names)), names)
    axis.set_ylabel("error rate (%)")
    axis.set_title(f"{PRESET}, {results[0]['steps']} steps per row: what each augmentation adds")
    axis.grid(axis="y", alpha=0.3)
    axis.legend(fontsize=8, ncol=len(series), loc="upper center", bbox_to_anchor=(0.5, -0.08))   # below: the bars reach 100
    figure.tight_layout()
    figure.savefig(path, dpi=120)
    plt.close(figure)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m recipes.asterisk.ablation", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", nargs="+", default=list(ROWS), choices=list(ROWS), metavar="ROW",
                        help=f"rows to train and score (default: all: {' '.join(ROWS)})")
    parser.add_argument("--steps", type=int, default=DEFAULT_STEPS,
                        help=f"training steps per row (default: {DEFAULT_STEPS}, the demo's budget)")
    parser.add_argument("--out", type=Path, default=Path("runs/asterisk_ablation"), help="folder of the runs")
    parser.add_argument("--train-override", action="append", default=[], metavar="KEY=VALUE",
                        help="extra asr.train override for every row (repeatable)")
    parser.add_argument("--publish", type=Path, default=None, metavar="DIR",
                        help="also copy ablation.md, ablation.json and ablation.png into DIR, e.g. recipes/asterisk")
    return parser


def run_ablation(args: argparse.Namespace) -> int:
    if args.steps < 1:
        print(f"recipes.asterisk.ablation: error: --steps={args.steps} must be >= 1", file=sys.stderr)
        return USAGE_ERROR
    started = time.perf_counter()
    results = []
    for row in args.rows:
        run_dir = args.out / row
        if not (run_dir / "results.json").is_file():
            status = train_row(row, run_dir, args.steps, args.train_override)
            if status != SUCCESS:
                print(f"recipes.asterisk.ablation: asr.train stopped on row {row} with exit status {status} "
                      "(its message is above)", file=sys.stderr)
                return status
        results.append(row_results(row, run_dir))
    results = earlier_rows(args.out / "ablation.json", exclude=args.rows, steps=args.steps) + results
    results.sort(key=lambda r: list(ROWS).index(r["row"]))
    table = format_table(results)
    (args.out / "ablation.md").write_text(table)
    (args.out / "ablation.json").write_text(json.dumps(results, indent=2) + "\n")
    plot(results, args.out / "ablation.png")
    if args.publish is not None:
        args.publish.mkdir(parents=True, exist_ok=True)
        for name in ("ablation.md", "ablation.json", "ablation.png"):
            shutil.copyfile(args.out / name, args.publish / name)
    print(f"\n{table}\n[ablation] done in {(time.perf_counter() - started) / 60:.1f} min; "
          f"ablation.md, ablation.json, ablation.png in {args.out}", flush=True)
    return SUCCESS


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return run_command("recipes.asterisk.ablation", lambda: run_ablation(args),
                       resume_hint="run the same command again: finished rows are skipped and the interrupted "
                                   "one resumes from its last finished epoch")


if __name__ == "__main__":
    sys.exit(main())

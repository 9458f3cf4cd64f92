"""Adapting a trained model to one real voice in ten minutes of it: the measurement in recipes/asterisk/RESULTS.md.

    python -m recipes.asterisk.adapt --init-from runs/synth_iclustered/<time>
    python -m recipes.asterisk.adapt --init-from RUN --lrs 1e-4 3e-4 --freezes none --steps 100 200 400

The asterisk dev half (recipes/asterisk: 149 prompts, 8.4 minutes of Allison Smith's voice) plays
"your ten minutes"; the test half (157 prompts) is what you then say. The test half never chooses.

1. The dev half is written as a Kaldi-style folder, `<out>/asterisk_dev/` (wav.scp naming the
   prepared FLAC files, text, utt2spk): exactly what a user gives `conf=adapt` (`kaldi_folder`).
2. Every (learning rate, freeze) of the sweep is one adaptation run, `<out>/runs/<lr>_<freeze>/`:
   `python -m asr.train conf=adapt init_from=... adapt.data_dir=<out>/asterisk_dev optim.lr=LR
   adapt.freeze=F trainer.max_steps=<the most steps> trainer.keep_checkpoints_every_n_steps=<their gcd>`.
   asr.train holds out 10% of the dev sentences (adapt.dev_fraction, seeded: the same part for every
   run). Each step count of the sweep is the run's checkpoint at that step: the preset has no warm-up
   and its plateau schedule follows the validation loss, not the budget, so the checkpoint at step N
   is what a run with trainer.max_steps=N ends with (checked on a tiny model: the step-5 and step-10
   checkpoints of 10- and 20-step runs equal the last.ckpt of 5- and 10-step runs bit for bit).
3. Every (lr, freeze, steps) is scored by greedy PER on the held-out part; the lowest is chosen (a tie
   goes to fewer steps, then to the order of the sweep).
4. The trained model as it was and the chosen checkpoint are scored on the asterisk test half (PER,
   and WER through the model's lexicon and LM with the asterisk words added, as the ablation does)
   and on the synth test split (PER: what adapting made the model forget).

Writes <out>/adapt.md (both tables) and <out>/adapt.json. Run it again after an interruption:
finished runs are skipped, an interrupted one resumes (ckpt_path=last), evaluations are reused.
"""
from __future__ import annotations

import argparse
import gzip
import json
import math
import sys
import time
from itertools import product
from pathlib import Path

from asr.core.exit_status import SUCCESS, USAGE_ERROR, run_command
from asr.training.adaptation import FREEZE_CHOICES
from recipes.child_run import run_to_end

REAL_SPEECH = "asterisk"
REAL_SPEECH_ROOT = Path("data/asterisk")   # prepared there on first use (recipes.asterisk.prepare)
SYNTH_ROOT = Path("data/synth")            # the demo's corpus: its test split says what was forgotten
DEFAULT_LRS = (1e-4, 3e-4, 1e-3)
DEFAULT_FREEZES = ("none", "encoder_lower_half")
DEFAULT_STEPS = (100, 200, 400)
SWEEP_COLUMNS = ("lr", "freeze", "steps", "held-out PER")
RESULT_COLUMNS = ("model", "asterisk test PER", "asterisk test WER (lexicon + LM)", "synth test PER")


def kaldi_folder(root: Path, split: str, out: Path) -> int:
    """Writes the prepared asterisk split as a Kaldi-style folder (wav.scp, text, utt2spk); the number
    of utterances. Only the audio and the words travel: asr.train makes the phone targets itself."""
    with gzip.open(root / f"{REAL_SPEECH}_cuts_{split}.jsonl.gz", "rt") as handle:
        cuts = [json.loads(line) for line in handle]
    out.mkdir(parents=True, exist_ok=True)
    wav, text, speakers = [], [], []
    for cut in sorted(cuts, key=lambda cut: cut["id"]):
        source = Path(cut["recording"]["sources"][0]["source"])
        supervision = cut["supervisions"][0]
        wav.append(f"{cut['id']} {(source if source.is_absolute() else root / source).resolve()}\n")
        text.append(f"{cut['id']} {supervision['text']}\n")
        speakers.append(f"{cut['id']} {supervision.get('speaker') or 'speaker'}\n")
    for name, lines in (("wav.scp", wav), ("text", text), ("utt2spk", speakers)):
        (out / name).write_text("".join(lines))
    return len(cuts)


def ensure_asterisk(root: Path) -> None:
    """The asterisk manifests, prepared into root when missing (a few minutes, once)."""
    if not (root / f"{REAL_SPEECH}_cuts_dev.jsonl.gz").is_file():
        from recipes.asterisk.prepare import prepare_asterisk
        prepare_asterisk(root)


def run_name(lr: float, freeze: str) -> str:
    return f"lr{lr:g}_{freeze}"


def adaptation_command(init_from: str, data_dir: Path, run_dir: Path, lr: float, freeze: str,
                       steps: list[int], extra: list[str]) -> list[str]:
    """The asr.train command of one run of the sweep (resuming it when it has a last.ckpt)."""
    command = [sys.executable, "-m", "asr.train", "conf=adapt", f"init_from={init_from}",
               f"adapt.data_dir={data_dir}", f"run_dir={run_dir}", f"optim.lr={lr:g}", f"adapt.freeze={freeze}",
               f"trainer.max_steps={max(steps)}", f"trainer.keep_checkpoints_every_n_steps={math.gcd(*steps)}",
               *extra]
    if (run_dir / "checkpoints" / "last.ckpt").is_file():
        command.append("ckpt_path=last")
    return command


def step_checkpoint(run_dir: Path, step: int) -> Path:
    return run_dir / "checkpoints" / f"step-{step:06d}.ckpt"   # asr.training.callbacks.StepCheckpoint


def evaluation(checkpoint: Path, out: Path, *arguments: str) -> dict:
    """asr.evaluate of `checkpoint` with `arguments` into `out` (reused when its results.json exists)."""
    if not (out / "results.json").is_file():
        from asr import evaluate
        code = evaluate.main([f"checkpoint={checkpoint}", f"out={out}", *arguments])
        if code != SUCCESS:
            raise RuntimeError(f"asr.evaluate of {checkpoint} ({' '.join(arguments)}) ended with status {code}")
    return json.loads((out / "results.json").read_text())


def choose(rows: list[dict]) -> dict:
    """The row of lowest held-out PER; a tie goes to fewer steps, then to the earlier row of the sweep."""
    return min(enumerate(rows), key=lambda item: (item[1]["held_out_per"], item[1]["steps"], item[0]))[1]


def final_scores(name: str, checkpoint: Path, out: Path) -> dict:
    """Asterisk test PER and lexicon + LM WER, synth test PER of one checkpoint."""
    asterisk = [f"data.corpus={REAL_SPEECH}", f"data.root={REAL_SPEECH_ROOT}", "split=test"]
    test = evaluation(checkpoint, out / "asterisk_test_lexicon", *asterisk, "decoder=lexicon",
                      f"extra_lexicon={REAL_SPEECH_ROOT / 'lexicon.txt'}")
    synth = evaluation(checkpoint, out / "synth_test", "data.corpus=synth", f"data.root={SYNTH_ROOT}", "split=test")
    return {"model": name, "checkpoint": str(checkpoint), "asterisk_test_per": test["error_rates"]["per"],
            "asterisk_test_wer": test["error_rates"]["wer_lexicon"], "synth_test_per": synth["error_rates"]["per"]}


def pct(value) -> str:
    return "-" if value is None else f"{100 * value:.1f}"


def format_tables(sweep: list[dict], results: list[dict]) -> str:
    chosen = choose(sweep)
    lines = ["| " + " | ".join(SWEEP_COLUMNS) + " |", "|---|---|---:|---:|"]
    lines += [f"| {row['lr']:g} | {row['freeze']} | {row['steps']} | {pct(row['held_out_per'])}"
              f"{' (chosen)' if row is chosen else ''} |" for row in sweep]
    lines += ["", "| " + " | ".join(RESULT_COLUMNS) + " |", "|---|---:|---:|---:|"]
    lines += [f"| {row['model']} | {pct(row['asterisk_test_per'])} | {pct(row['asterisk_test_wer'])} | "
              f"{pct(row['synth_test_per'])} |" for row in results]
    return "\n".join(lines) + "\n"


def train_run(command: list[str]) -> int:
    print(f"[adapt] {' '.join(command[2:])}", flush=True)
    return run_to_end(command)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m recipes.asterisk.adapt", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--init-from", required=True, help="the trained model: a .ckpt or its run folder")
    parser.add_argument("--lrs", nargs="+", type=float, default=list(DEFAULT_LRS), metavar="LR")
    parser.add_argument("--freezes", nargs="+", default=list(DEFAULT_FREEZES), choices=FREEZE_CHOICES,
                        metavar="FREEZE", help=f"adapt.freeze values ({', '.join(FREEZE_CHOICES)})")
    parser.add_argument("--steps", nargs="+", type=int, default=list(DEFAULT_STEPS), metavar="N",
                        help="step counts to choose among (each run trains to the most)")
    parser.add_argument("--out", type=Path, default=Path("runs/asterisk_adapt"), help="folder of the runs")
    parser.add_argument("--train-override", action="append", default=[], metavar="KEY=VALUE",
                        help="extra asr.train override for every run (repeatable)")
    return parser


def run_sweep(args: argparse.Namespace) -> int:
    if min(args.steps) < 1 or not args.lrs or min(args.lrs) <= 0:
        print("recipes.asterisk.adapt: error: --steps must be >= 1 and --lrs > 0", file=sys.stderr)
        return USAGE_ERROR
    started = time.perf_counter()
    ensure_asterisk(REAL_SPEECH_ROOT)
    data_dir = args.out / "asterisk_dev"
    kaldi_folder(REAL_SPEECH_ROOT, "dev", data_dir)
    sweep = []
    for lr, freeze in product(args.lrs, args.freezes):
        run_dir = args.out / "runs" / run_name(lr, freeze)
        if not all(step_checkpoint(run_dir, step).is_file() for step in args.steps):
            status = train_run(adaptation_command(args.init_from, data_dir, run_dir, lr, freeze, args.steps,
                                                  args.train_override))
            if status != SUCCESS:
                print(f"recipes.asterisk.adapt: asr.train stopped on {run_dir} with exit status {status}",
                      file=sys.stderr)
                return status
        for steps in sorted(args.steps):
            held_out = evaluation(step_checkpoint(run_dir, steps), run_dir / "evaluations" / f"held_out_{steps}",
                                  "split=dev")
            sweep.append({"lr": lr, "freeze": freeze, "steps": steps, "run": str(run_dir),
                          "held_out_per": held_out["error_rates"]["per"]})
    chosen = choose(sweep)
    source = Path(args.init_from)
    source = source if source.is_file() else source / "checkpoints" / "best.ckpt"
    results = [final_scores("as trained (no adaptation)", source, args.out / "evaluations" / "as_trained"),
               final_scores(f"adapted: lr {chosen['lr']:g}, freeze {chosen['freeze']}, {chosen['steps']} steps",
                            step_checkpoint(Path(chosen["run"]), chosen["steps"]),
                            Path(chosen["run"]) / "evaluations" / f"final_{chosen['steps']}")]
    tables = format_tables(sweep, results)
    (args.out / "adapt.md").write_text(tables)
    (args.out / "adapt.json").write_text(json.dumps({"sweep": sweep, "chosen": chosen, "results": results},
                                                    indent=2) + "\n")
    print(f"\n{tables}\n[adapt] done in {(time.perf_counter() - started) / 60:.1f} min; adapt.md, adapt.json "
          f"in {args.out}", flush=True)
    return SUCCESS


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return run_command("recipes.asterisk.adapt", lambda: run_sweep(args),
                       resume_hint="run the same command again: finished runs are skipped and the interrupted "
                                   "one resumes from its last finished epoch")


if __name__ == "__main__":
    sys.exit(main())

"""Tune the lexicon decoder's lm_weight and word_score on a dev split (never on test).

    python -m asr.tune_lm checkpoint=runs/.../best.ckpt split=dev
    python -m asr.tune_lm checkpoint=best.ckpt lm_weights=[0,0.5,1,2] word_scores=[-1,0,1] lexicon=L lm=LM

The lexicon and LM are the model's unless given (found as asr.evaluate finds them); lexicon= needs
lm= (a path, or none), extra_lexicon= adds entries on top of the lexicon.

The model runs once over the split; the saved log-probabilities are then decoded with every
(lm_weight, word_score) pair of the grid (asr.evaluation.decoding, in worker processes). Prints a WER
table and the best pair, to pass to `python -m asr.evaluate ... decoder=lexicon lm_weight=...
word_score=...`; writes the table to <run folder>/tune_lm_<split>.json (or `out`).
"""
from __future__ import annotations

import sys

from asr.config.command_line import key_value_config, run_key_value_command
from asr.core.errors import EvaluationError
from asr.evaluation.evaluation import USAGE_ERRORS
from asr.evaluation.lm_tuning import TuneConfig, tune


def parse_arguments(argv: list[str]) -> TuneConfig:
    config = key_value_config(TuneConfig, argv, EvaluationError)
    if not config.checkpoint:
        raise EvaluationError("give the checkpoint: checkpoint=PATH")
    if not config.lm_weights or not config.word_scores:
        raise EvaluationError("lm_weights and word_scores need at least one value each, e.g. lm_weights=[0.5,1]")
    return config


def format_table(report: dict) -> str:
    weights = sorted({row["lm_weight"] for row in report["grid"]})
    scores = sorted({row["word_score"] for row in report["grid"]})
    wer = {(row["lm_weight"], row["word_score"]): row["wer"] for row in report["grid"]}
    lines = [f"WER (%) on {report['split']}: rows lm_weight, columns word_score",
             "| lm_weight \\ word_score | " + " | ".join(f"{s:g}" for s in scores) + " |",
             "|---|" + "---:|" * len(scores)]
    for weight in weights:
        lines.append(f"| {weight:g} | " + " | ".join(f"{100 * wer[weight, s]:.2f}" for s in scores) + " |")
    best = report["best"]
    lines.append(f"best: lm_weight={best['lm_weight']:g} word_score={best['word_score']:g} "
                 f"(WER {100 * best['wer']:.2f}%)")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    return run_key_value_command("asr.tune_lm", __doc__, tune_and_print, argv, usage_errors=USAGE_ERRORS)


def tune_and_print(argv: list[str]) -> None:
    report = tune(parse_arguments(argv))
    print(format_table(report))
    print(f"wrote {report['out']}")


if __name__ == "__main__":
    sys.exit(main())

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

import json
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import List, Optional

import torch

from asr.evaluation.decoding.evaluation import resolve_settings, start_word_decoder, word_head
from asr.model.decoding_files import model_decoding_files
from asr.evaluation.evaluation import USAGE_ERRORS, load_model
from asr.core.errors import EvaluationError
from asr.evaluation.evaluation_data import evaluation_data
from asr.config.command_line import key_value_config, run_key_value_command
from asr.text.metrics import word_error_rate
from asr.model.run_folder import run_folder_of, trained_data_config


@dataclass
class TuneConfig:
    checkpoint: Optional[str] = None
    split: str = "dev"
    lm_weights: List[float] = field(default_factory=lambda: [0.0, 0.5, 1.0, 1.5, 2.0])
    word_scores: List[float] = field(default_factory=lambda: [-1.0, 0.0, 1.0, 2.0])
    lexicon: Optional[str] = None        # None: the model's (needs lm= when given)
    lm: Optional[str] = None             # None: the model's; none: no LM
    extra_lexicon: Optional[str] = None  # entries added on top of the lexicon
    beam: int = 50
    decode_workers: Optional[int] = None
    data: dict = field(default_factory=dict)
    out: Optional[str] = None
    progress: bool = True


def parse_arguments(argv: list[str]) -> TuneConfig:
    config = key_value_config(TuneConfig, argv, EvaluationError)
    if not config.checkpoint:
        raise EvaluationError("give the checkpoint: checkpoint=PATH")
    if not config.lm_weights or not config.word_scores:
        raise EvaluationError("lm_weights and word_scores need at least one value each, e.g. lm_weights=[0.5,1]")
    return config


@torch.no_grad()
def split_log_probs(model, data, head: str, progress: bool) -> tuple[list, list[str]]:
    """The word head's log-probabilities (numpy, one per utterance) and the word references."""
    from tqdm.auto import tqdm
    rows, references = [], []
    for batch in tqdm(data.datamodule.dataloader(data.split), desc=f"forward {data.split}", unit="batch",
                      disable=not progress, leave=False):
        log_probs, lengths = model(batch["features"], batch["feature_lengths"])
        scores = log_probs[head].cpu().numpy()
        rows.extend(scores[i, :int(n)] for i, n in enumerate(lengths))
        references.extend(batch["texts"])
    return rows, references


def tune(config: TuneConfig) -> dict:
    test_split = {**trained_data_config(config.checkpoint), **config.data}.get("test_split", "test")
    if config.split == test_split:
        raise EvaluationError(f"split={config.split!r} is the corpus's test split; tune on dev "
                              "(a test WER from tuned weights would be optimistic)")
    model = load_model(config.checkpoint)
    files = model_decoding_files(config.checkpoint)
    resolve_settings(config.lexicon, config.lm, files, config.extra_lexicon)   # option errors before any work
    data = evaluation_data(model, config.checkpoint, config.split, None, dict(config.data), config.progress)
    head = word_head(model.tokenizers)
    rows, references = split_log_probs(model, data, head, config.progress)
    table = []
    from tqdm.auto import tqdm
    # a bar, not a line per pair: the table at the end gives every WER once
    grid = tqdm([(lm_weight, word_score) for lm_weight in config.lm_weights for word_score in config.word_scores],
                desc="lm_weight x word_score", unit="pair", disable=not config.progress, leave=False)
    for lm_weight, word_score in grid:
        settings = resolve_settings(config.lexicon, config.lm, files, config.extra_lexicon, lm_weight=lm_weight,
                                    word_score=word_score, beam=config.beam)
        started = time.perf_counter()
        _, decoder = start_word_decoder(model.tokenizers, settings, config.decode_workers)
        try:
            hypotheses = [result.get() for result in [decoder.submit(row) for row in rows]]
        finally:
            decoder.close()
        table.append({"lm_weight": lm_weight, "word_score": word_score,
                      "wer": word_error_rate(references, hypotheses),
                      "seconds": time.perf_counter() - started})
    best = min(table, key=lambda row: row["wer"])
    report = {"checkpoint": config.checkpoint, "split": data.split, "head": head, "lexicon": settings.lexicon,
              "lm": settings.lm, "beam": config.beam, "grid": table, "best": best}
    run = run_folder_of(config.checkpoint)
    out = Path(config.out) if config.out else (run or Path(".")) / f"tune_lm_{data.split}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=2) + "\n")
    report["out"] = str(out)
    return report


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

"""Tuning the lexicon decoder's lm_weight and word_score on a split: the model runs once over it, and
its saved log-probabilities are decoded with every (lm_weight, word_score) pair of the grid (in
worker processes, asr.evaluation.decoding); the WER of each pair and the best one are written as a
JSON report. The test split is refused (a test WER from tuned weights would be optimistic).
`python -m asr.tune_lm` is the command.
"""
from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import List, Optional

import torch

from asr.core.errors import EvaluationError
from asr.evaluation.decoding.evaluation import resolve_settings, start_word_decoder, word_head
from asr.evaluation.evaluation import load_model
from asr.evaluation.evaluation_data import evaluation_data
from asr.model.decoding_files import model_decoding_files
from asr.model.run_folder import run_folder_of, trained_data_config
from asr.text.metrics import word_error_rate


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

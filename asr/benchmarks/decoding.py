"""Greedy vs prefix beam vs lexicon-only vs lexicon + LM on one split, side by side in one run.

    python -m asr.benchmarks.decoding checkpoint=runs/.../best.ckpt [split=test workers=2 lm_weight=1 word_score=0]
    python -m asr.benchmarks.decoding simulate_per=0.05 data_root=/work/data/synth   # no model (see below)

The model runs once over the split (its forward time is printed); each decoder then decodes the
same saved log-probabilities, and the table gives per decoder the WER, its decoding seconds and
the whole evaluation's time (forward + decoding) as a multiple of greedy's. Lexicon decoding
uses `workers` processes (asr.evaluation.decoding.lexicon_decoder.ParallelLexiconDecoder).

`simulate_per=P` replaces the model by emissions made from the split's reference phones with a
fraction P of them replaced by a random phone (one peaked frame per phone, then a blank frame):
what the lexicon and LM make of a phone recogniser of about that PER, without a trained model.
"""
from __future__ import annotations

import gzip
import json
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

import numpy as np
import torch

from asr.data.corpus.manifests import corpus_root, default_root, manifest_path
from asr.evaluation.decoding.evaluation import resolve_settings, word_head
from asr.model.decoding_files import corpus_decoding_files, model_decoding_files
from asr.evaluation.decoding.lexicon_decoder import ParallelLexiconDecoder
from asr.evaluation.evaluation import USAGE_ERRORS, load_model
from asr.core.errors import EvaluationError
from asr.evaluation.evaluation_data import evaluation_data
from asr.config.command_line import key_value_config, run_key_value_command
from asr.text.metrics import phone_error_rate, word_error_rate


@dataclass
class BenchmarkConfig:
    checkpoint: Optional[str] = None
    split: str = "test"
    data_root: Optional[str] = None       # the corpus folder (default: the checkpoint's)
    lexicon: Optional[str] = None         # default: the model's (simulate_per: data_root's); needs lm=
    lm: Optional[str] = None
    lm_weight: float = 1.0
    word_score: float = 0.0
    beam: int = 50
    beam_size: int = 8                    # the prefix beam search's
    workers: int = 2
    simulate_per: Optional[float] = None
    seed: int = 0


def simulated_emissions(root: Path, split: str, per: float, seed: int):
    """(log-probs per utterance, word references, phone references, the phones tokenizer, greedy phones)."""
    from asr.data.splits.tokenizers import build_tokenizer
    tokenizer = build_tokenizer("phones")
    rng = np.random.default_rng(seed)
    vocab = tokenizer.vocab_size
    with gzip.open(manifest_path(root, "synth", "supervisions", split), "rt") as handle:
        rows = [json.loads(line) for line in handle]
    emissions, greedy = [], []
    for row in rows:
        frames, said = [], []
        for true in tokenizer.encode(row["custom"]["phones"]):
            heard = int(rng.integers(1, vocab)) if rng.random() < per else true
            said.append(heard)
            frame = np.full(vocab, 0.02 / (vocab - 2))
            frame[heard], frame[0] = (0.98, 0.02) if heard == true else (0.7, 0.08)
            if heard != true:
                frame[true] = 0.2
            blank = np.full(vocab, 0.02 / (vocab - 1))
            blank[0] = 0.98
            frames += [frame / frame.sum(), blank]
        emissions.append(np.log(np.array(frames, dtype=np.float32)))
        greedy.append(tokenizer.decode(said))
    return emissions, [r["text"] for r in rows], [r["custom"]["phones"] for r in rows], tokenizer, greedy


@torch.no_grad()
def model_emissions(config: BenchmarkConfig):
    """(the lexicon head's log-probs, references, its tokenizer, forward seconds, corpus folder,
    the first word head's tokenizer and log-probs, or None)."""
    model = load_model(config.checkpoint)
    overrides = {"root": config.data_root} if config.data_root else {}
    data = evaluation_data(model, config.checkpoint, config.split, None, overrides, progress=False)
    head = word_head(model.tokenizers)
    text_head = next((kind for kind, t in model.tokenizers.items() if t.field == "text"), None)
    rows, text_rows, references, forward = [], [], [], 0.0
    for batch in data.datamodule.dataloader(data.split):
        started = time.perf_counter()
        log_probs, lengths = model(batch["features"], batch["feature_lengths"])
        forward += time.perf_counter() - started
        for kind, out in ((head, rows), (text_head, text_rows)):
            if kind is not None:
                scores = log_probs[kind].numpy()
                out.extend(scores[i, :int(n)] for i, n in enumerate(lengths))
        references.extend(batch["texts"])
    text = (model.tokenizers[text_head], text_rows) if text_head else None
    return rows, references, model.tokenizers[head], forward, data.datamodule.corpus.root, text


def run(config: BenchmarkConfig) -> list[dict]:
    if config.simulate_per is not None:
        root = corpus_root(config.data_root or default_root("synth"))
        rows, references, phone_refs, tokenizer, greedy_phones = simulated_emissions(
            root, config.split, config.simulate_per, config.seed)
        forward, text = 0.0, None
        files = corpus_decoding_files(root)
        print(f"simulated emissions: greedy PER {100 * phone_error_rate(phone_refs, greedy_phones):.2f}% "
              f"on {len(rows)} utterances of {config.split}")
    else:
        rows, references, tokenizer, forward, root, text = model_emissions(config)
        files = model_decoding_files(config.checkpoint)
        print(f"forward pass: {forward:.1f} s for {len(rows)} utterances of {config.split}")
    from asr.model.ctc import greedy_decode, prefix_beam_search
    results = []

    def record(name: str, hypotheses: list[str] | None, seconds: float) -> None:
        results.append({"decoder": name, "wer": None if hypotheses is None else word_error_rate(references, hypotheses),
                        "seconds": seconds})

    # greedy and prefix beam search read the word head (chars / pieces): they know no words
    text_tokenizer, text_rows = text if text is not None else (tokenizer, rows)
    started = time.perf_counter()
    greedy = [text_tokenizer.decode(greedy_decode(torch.from_numpy(r)[None], torch.tensor([len(r)]))[0])
              for r in text_rows]
    record(f"greedy ({text_tokenizer.kind})", greedy if text else None, time.perf_counter() - started)
    started = time.perf_counter()
    beam = [text_tokenizer.decode(prefix_beam_search(torch.from_numpy(r), len(r), config.beam_size))
            for r in text_rows]
    record(f"prefix beam {config.beam_size} ({text_tokenizer.kind})", beam if text else None,
           time.perf_counter() - started)
    for name, lm, weight in (("lexicon only", "none", 0.0), ("lexicon + LM", config.lm, config.lm_weight)):
        settings = resolve_settings(config.lexicon, lm, files, lm_weight=weight, word_score=config.word_score,
                                    beam=config.beam)
        started = time.perf_counter()
        with ParallelLexiconDecoder(tokenizer, settings, config.workers) as decoder:
            hypotheses = [result.get() for result in [decoder.submit(row) for row in rows]]
        record(f"{name} ({tokenizer.kind})", hypotheses, time.perf_counter() - started)
    greedy_total = forward + results[0]["seconds"]
    print(f"| decoder | WER (%) | decoding s | forward + decoding, x greedy |")
    print("|---|---:|---:|---:|")
    for row in results:
        wer = "-" if row["wer"] is None else f"{100 * row['wer']:.2f}"
        print(f"| {row['decoder']} | {wer} | {row['seconds']:.1f} | {(forward + row['seconds']) / greedy_total:.2f} |")
    print(f"({config.workers} lexicon workers, torch threads {torch.get_num_threads()}; lm_weight "
          f"{config.lm_weight}, word_score {config.word_score}, beam {config.beam})")
    return results


def main(argv: list[str] | None = None) -> int:
    return run_key_value_command("asr.benchmarks.decoding", __doc__, lambda arguments: run(parse_arguments(arguments))
                                 and None, argv, usage_errors=USAGE_ERRORS)


def parse_arguments(argv: list[str]) -> BenchmarkConfig:
    config = key_value_config(BenchmarkConfig, argv, EvaluationError)
    if config.checkpoint is None and config.simulate_per is None:
        raise EvaluationError("give checkpoint=PATH, or simulate_per=P data_root=CORPUS")
    return config


if __name__ == "__main__":
    sys.exit(main())

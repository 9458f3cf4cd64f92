"""The train-with x evaluate-with matrix (Table 1 of 'Fast Transformers with Clustered Attention').

    python -m asr.cross_matrix runs/full/.../best.ckpt runs/iclustered/.../best.ckpt --out matrix/
    python -m asr.cross_matrix full=a.ckpt iclustered=b.ckpt --specs full clustered-25 clustered-50
    python -m asr.cross_matrix *.ckpt --split dev --data-dir my_audio/
    python -m asr.cross_matrix *.ckpt --decoder lexicon [--lexicon L --lm LM --lm-weight 1 --word-score 0]

Columns are trained models (a checkpoint, optionally named LABEL=PATH; otherwise its run folder's
name), rows are evaluate-with attention specs (default: the paper's rows, then linear and
agglomerative-8). Every valid cell is one `asr.evaluate` run: the column's weights with the row's
attention in every layer, on the same split. A pair that cannot be valid (lsh or shared-full on a
model with separate query and key projections, agglomerative with more classes than the head dim) is
"-"; the cell whose attention equals the training attention is marked *. On a shared-QK column the
full, clustered, i-clustered and oracle-top rows run in the key form the model was trained with
(after shared_full or lsh: unit-normalised keys, no attention to self; attention_ext.attentions.reformer_key_form,
computed densely, so their times stay out of the row's mean); --shared-qk-keys raw gives them keys
equal to the raw queries, the form every matrix had before the key form was followed.

Writes to --out (default: cross_matrix/):
    cells/<column>__<row>.json   one evaluation per cell; a run that is started again reuses
                                 them (and recomputes a cell whose checkpoint changed)
    matrix.md, matrix.csv, matrix.json   PER (and WER) per cell, forward time per row; with
                                 --decoder lexicon the WER table is the lexicon + LM decoder's
                                 (asr.evaluation.decoding; lexicon and LM default to each model's own)
    matrix_heatmap.png           PER per cell
    speed_accuracy.png           per column: error against forward time of each row (Fig. 1)
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

from asr.evaluation.attention_matrix import run
from asr.evaluation.evaluation import USAGE_ERRORS
from asr.core.errors import EvaluationError
from asr.evaluation.attention_choice import SHARED_QK_KEYS
from asr.core.exit_status import run_command
from asr.core.warning_filters import install_warning_filters
from attention_ext.comparisons import cross_matrix_rows

# The default rows: the paper's, then the further linear-cost attentions of this project (declared
# in attention_ext.comparisons).
DEFAULT_SPECS = cross_matrix_rows()


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m asr.cross_matrix", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("checkpoints", nargs="+", metavar="[LABEL=]CHECKPOINT",
                        help="trained models, the columns")
    parser.add_argument("--specs", nargs="+", default=list(DEFAULT_SPECS), metavar="SPEC",
                        help=f"evaluate-with attention specs, the rows (default: {' '.join(DEFAULT_SPECS)}); "
                             "cluster counts are numbers, e.g. clustered-25 for short sequences")
    parser.add_argument("--split", default=None, help="split of the models' corpus (default: its test split)")
    parser.add_argument("--data-dir", default=None, help="score a Kaldi-style data directory instead of a split")
    parser.add_argument("--data", nargs="*", default=[], metavar="KEY=VALUE",
                        help="data option overrides, e.g. --data root=data/synth max_duration=100")
    parser.add_argument("--decoder", choices=("greedy", "beam", "lexicon"), default="greedy",
                        help="lexicon: words through a lexicon and an n-gram LM (an extra WER table)")
    parser.add_argument("--lexicon", default=None,
                        help="--decoder lexicon: lexicon file (default: each model's; needs --lm)")
    parser.add_argument("--lm", default=None, help="--decoder lexicon: ARPA LM (default: each model's; none: no LM)")
    parser.add_argument("--extra-lexicon", default=None, help="--decoder lexicon: entries added on top of the lexicon")
    parser.add_argument("--lm-weight", type=float, default=1.0)
    parser.add_argument("--word-score", type=float, default=0.0)
    parser.add_argument("--beam-size", type=int, default=8)
    parser.add_argument("--shared-qk-keys", choices=tuple(SHARED_QK_KEYS), default="trained",
                        help="keys of full, clustered, i-clustered and oracle-top on shared-QK columns: "
                             + "; ".join(f"{name}: {meaning}" for name, meaning in SHARED_QK_KEYS.items())
                             + " (default: trained; after shared_full or lsh that is unit-normalised keys, "
                               "no attention to self)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the random hashing (clustered, lsh)")
    parser.add_argument("--limit", type=int, default=None, help="evaluate only the first N batches per cell")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's)")
    parser.add_argument("--out", type=Path, default=Path("cross_matrix"))
    return parser


def parse_data_overrides(items: list[str]) -> dict:
    import yaml
    overrides = {}
    for item in items:
        key, equals, value = item.partition("=")
        if not equals:
            raise EvaluationError(f"--data {item!r} is not KEY=VALUE (e.g. --data root=data/synth)")
        overrides[key] = yaml.safe_load(value)
    return overrides



def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)       # a bad option: argparse exits with USAGE_ERROR
    install_warning_filters()
    return run_command("asr.cross_matrix", lambda: _run_and_print(args), usage_errors=USAGE_ERRORS,
                       resume_hint="run the same command again: the cells computed so far are reused")


def _run_and_print(args: argparse.Namespace) -> None:
    args.data = parse_data_overrides(args.data)
    run(args)
    print((args.out / "matrix.md").read_text())
    print(f"wrote {args.out}/matrix.md, matrix.csv, matrix.json, matrix_heatmap.png, speed_accuracy.png")


if __name__ == "__main__":
    sys.exit(main())

"""The synthetic corpus's pronunciation lexicon and word trigram LM, for lexicon decoding.

- ``lexicon.txt``: every word of the corpus's transcripts (train, dev and test: a closed
  vocabulary, as in WSJ's standard 20k setup), with the pronunciations the synthesisers give the
  word spoken alone (``asr.evaluation.decoding.pronunciation``: espeak-ng en-us and en-us-nyc, flite), plus
  the weak form of the WEAK_FORM_WORDS most frequent one-vowel words of the training text.
- ``lm/3gram.arpa.gz``: a modified Kneser-Ney trigram (``asr.evaluation.decoding.ngram``) estimated on the
  *training* transcripts only, with the whole lexicon as its vocabulary (so dev/test words that
  training never saw get the interpolated unigram share, as in a closed-vocabulary LM).

Both are written atomically; an existing file is kept, so a rerun finishes what is missing, unless
the generator has just written the manifests anew (``replace``): then both are made from them.
"""
from __future__ import annotations

import gzip
import json
from pathlib import Path

from asr.data.corpus.manifests import manifest_path
from asr.evaluation.decoding.lexicon import read_lexicon, write_lexicon
from asr.evaluation.decoding.ngram import estimate_arpa
from asr.evaluation.decoding.pronunciation import add_weak_forms, synthesiser_pronunciations

LEXICON_FILE = "lexicon.txt"
LM_FILE = "lm/3gram.arpa.gz"
LM_ORDER = 3


def transcripts(out_dir: Path, corpus: str, split: str) -> list[str]:
    """The word transcripts of one split, from its supervision manifest."""
    path = manifest_path(out_dir, corpus, "supervisions", split)
    with gzip.open(path, "rt", encoding="utf-8") as handle:
        return [json.loads(line)["text"] for line in handle if line.strip()]


def write_lexicon_and_lm(out_dir: str | Path, corpus: str = "synth", splits=("train", "dev", "test"),
                         train_split: str = "train", replace: bool = False) -> dict:
    """Writes out_dir/lexicon.txt and out_dir/lm/3gram.arpa.gz where missing (with `replace`, anew
    over existing ones); returns what it did."""
    out_dir = Path(out_dir)
    lexicon_path, lm_path = out_dir / LEXICON_FILE, out_dir / LM_FILE
    summary: dict = {"lexicon": str(lexicon_path), "lm": str(lm_path)}
    texts = {split: transcripts(out_dir, corpus, split) for split in splits}
    vocabulary = sorted({word for split_texts in texts.values() for text in split_texts for word in text.split()})
    if replace or not lexicon_path.is_file():
        lexicon, unpronounced = synthesiser_pronunciations(vocabulary)
        add_weak_forms(lexicon, texts[train_split])
        write_lexicon(lexicon, lexicon_path)
        summary.update(lexicon_words=len(lexicon), unpronounced_words=unpronounced)
    if replace or not lm_path.is_file():
        words = sorted(read_lexicon(lexicon_path))
        estimate_arpa(texts[train_split], lm_path, order=LM_ORDER, vocabulary=words)
        summary.update(lm_order=LM_ORDER, lm_training_sentences=len(texts[train_split]))
    return summary

"""TIMIT (LDC93S1): manifests with 61-phone targets (scored folded to 39); see README.md."""

from asr.data.corpus.corpus_recipes import CorpusRecipe

# How asr's messages about missing manifests say to prepare it (recipes/corpora.py finds this).
RECIPE = CorpusRecipe("timit", prepare_command="python -m recipes.timit.prepare --corpus-dir TIMIT_DIR --out {root}")

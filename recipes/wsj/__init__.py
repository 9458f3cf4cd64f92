"""WSJ (LDC93S6B + LDC94S13B): manifests with CMUdict phone targets and words; see README.md."""

from asr.data.corpus.corpus_recipes import CorpusRecipe

# How asr's messages about missing manifests say to prepare it (recipes/corpora.py finds this).
RECIPE = CorpusRecipe("wsj", prepare_command="python -m recipes.wsj.prepare --corpus-dir WSJ0_DIR WSJ1_DIR --lexicon cmudict-0.7b --out {root}")

"""Switchboard-1 (LDC97S62) + ms98 transcripts: manifests of conversation-side segments; see README.md."""

from asr.data.corpus.corpus_recipes import CorpusRecipe

# How asr's messages about missing manifests say to prepare it (recipes/corpora.py finds this).
RECIPE = CorpusRecipe("switchboard", prepare_command=("python -m recipes.switchboard.prepare --corpus-dir LDC97S62_DIR "
                       "--transcripts-dir swb_ms98_transcriptions --out {root}"))

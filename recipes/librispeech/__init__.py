"""LibriSpeech (OpenSLR 12): manifests with word targets (optionally phones); see README.md."""

from asr.data.corpus.corpus_recipes import CorpusRecipe

# How asr's messages about missing manifests say to prepare it (recipes/corpora.py finds this).
RECIPE = CorpusRecipe("librispeech", prepare_command=("python -m recipes.librispeech.prepare --corpus-dir LIBRISPEECH_DIR (or --download mini|all) "
                       "--out {root}"))

"""Debian's Asterisk voice prompts (one human voice): a real-speech dev/test set with ARPABET_39
phone references from espeak-ng; see README.md."""

from asr.data.corpus.corpus_recipes import CorpusRecipe


def generate(out_dir, **options) -> dict:
    """What asr.evaluate runs when the asterisk manifests are missing (dev and test only, real speech
    for evaluation, from two Debian packages the recipe names): prepare_asterisk, imported only then."""
    from recipes.asterisk.prepare import prepare_asterisk

    return prepare_asterisk(out_dir, **options)


# (recipes/corpora.py finds this.)
RECIPE = CorpusRecipe("asterisk", prepare_command="python -m recipes.asterisk.prepare --out {root}",
                      preparer=generate, evaluation_splits=("dev", "test"))

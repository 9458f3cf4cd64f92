"""The built-in synthetic speech corpus: WordNet sentences spoken by espeak-ng and flite voices.

``prepare_synth(out_dir, ...)`` (``python -m recipes.synth.prepare``) writes lhotse manifests with
word and ARPAbet phone targets; see README.md in this folder.
"""

from asr.data.corpus.corpus_recipes import CorpusRecipe


def generate(out_dir, **options) -> dict:
    """What asr.train runs when the synth manifests are missing: prepare_synth, imported only then."""
    from recipes.synth.prepare import prepare_synth

    return prepare_synth(out_dir, **options)


# The built-in corpus: asr.train generates it itself, sized by the config's synth_corpus section
# (recipes/corpora.py finds this).
RECIPE = CorpusRecipe("synth", prepare_command="python -m recipes.synth.prepare --out {root}",
                      preparer=generate, options_section="synth_corpus")


def __getattr__(name):
    # Lazy, so that `python -m recipes.synth.prepare` does not import the module twice.
    if name == "prepare_synth":
        from recipes.synth.prepare import prepare_synth

        return prepare_synth
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = ["prepare_synth"]

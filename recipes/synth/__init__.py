"""The built-in synthetic speech corpus: WordNet sentences spoken by espeak-ng and flite voices.

``prepare_synth(out_dir, ...)`` (``python -m recipes.synth.prepare``) writes lhotse manifests with
word and ARPAbet phone targets; see README.md in this folder.
"""


def __getattr__(name):
    # Lazy, so that `python -m recipes.synth.prepare` does not import the module twice.
    if name == "prepare_synth":
        from recipes.synth.prepare import prepare_synth

        return prepare_synth
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = ["prepare_synth"]

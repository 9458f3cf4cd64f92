"""The corpus recipes of this package, for asr (entry point `asr.corpus_recipes`, pyproject.toml).

Every folder recipes/<corpus>/ whose __init__.py declares `RECIPE = CorpusRecipe(...)` is one;
folders without (noise/: augmentation data, not a corpus) are not. A new corpus is found by its
folder alone.
"""
from __future__ import annotations

import importlib
import pkgutil

import recipes
from asr.data.corpus.corpus_recipes import CorpusRecipe


def corpus_recipes() -> list[CorpusRecipe]:
    found = []
    for module in pkgutil.iter_modules(recipes.__path__):
        if module.ispkg:
            recipe = getattr(importlib.import_module(f"recipes.{module.name}"), "RECIPE", None)
            if recipe is not None:
                found.append(recipe)
    return found

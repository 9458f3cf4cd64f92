"""Corpus recipes: the one way asr reaches a recipe, so that asr never imports recipes.

A package that holds corpus recipes registers one Python entry point in the group
`asr.corpus_recipes`: a function returning its `CorpusRecipe`s. This project registers the
`recipes` package (pyproject.toml), whose function lists every folder recipes/<corpus>/ that
declares `RECIPE = CorpusRecipe(...)` in its __init__.py (recipes/corpora.py):

    [project.entry-points."asr.corpus_recipes"]
    recipes = "recipes.corpora:corpus_recipes"

so a new corpus is its folder (and its data config): nothing in asr, nor in pyproject.toml, names it.
A recipe says
- `prepare_command`: how a user prepares the corpus; an error about missing manifests names it
  with the folder the config points at ({root});
- `preparer`, only for corpora that asr.train generates itself when their manifests are missing
  (the built-in synth corpus, the asterisk evaluation set): called as
  `preparer(root, progress=True, **options)`, options being the config section named by
  `options_section` (synth: `synth_corpus`) when asr.train calls it, none from asr.evaluate. It writes
  the manifests (`asr.data.corpus.manifests.cuts_path`); what it returns is logged. asr.train calls
  it under the folder's lock (asr.core.corpus_lock), so two runs never generate one folder at once;
- `evaluation_splits`: the splits of an evaluation set that asr.evaluate prepares on first use, and
  only into a folder that does not exist yet or is empty (asterisk: dev, test); empty (synth):
  asr.evaluate never generates the corpus, its missing manifests are an error naming the command.

Entry points are read from the installed project's metadata, so a change of the group takes effect
after `pip install --no-build-isolation -e .` (`.ci/install.sh` runs it).
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from importlib.metadata import entry_points
from typing import Callable

GROUP = "asr.corpus_recipes"


@dataclass(frozen=True)
class CorpusRecipe:
    corpus: str                                 # data.corpus: the manifests' name prefix
    prepare_command: str                        # e.g. "python -m recipes.timit.prepare --corpus-dir TIMIT_DIR --out {root}"
    preparer: Callable | None = None            # generates the corpus itself (synth, asterisk); None: the user's corpus
    options_section: str | None = None          # the train config's section of preparer options (synth_corpus)
    evaluation_splits: tuple[str, ...] = ()     # what asr.evaluate may prepare into an absent folder (asterisk)


def corpus_recipes() -> dict[str, CorpusRecipe]:
    """Every recipe of every package registered in the group, by corpus name."""
    recipes = {}
    for entry in entry_points(group=GROUP):
        for recipe in entry.load()():
            recipes.setdefault(recipe.corpus, recipe)
    return recipes


def corpus_recipe(corpus: str) -> CorpusRecipe | None:
    return corpus_recipes().get(corpus)


def corpus_preparer(corpus: str) -> Callable | None:
    """The preparer of `corpus`, or None (a corpus the user prepares with its recipe)."""
    recipe = corpus_recipe(corpus)
    return recipe.preparer if recipe is not None else None


def preparation_hint(corpus: str, root: str | os.PathLike) -> str:
    """'prepare them with `python -m recipes.<corpus>.prepare ... --out <root>` (see its README)'."""
    recipe = corpus_recipe(corpus)
    if recipe is None:
        return (f"write them with a recipe for corpus {corpus!r} (recipes/README.md says how to add one) "
                f"into {root}")
    return f"prepare them with `{recipe.prepare_command.format(root=root)}` (see recipes/{corpus}/README.md)"


def unregistered_note() -> str:
    """For an error about missing manifests: which corpora asr.train would have generated itself."""
    generated = sorted(name for name, recipe in corpus_recipes().items() if recipe.preparer is not None)
    if generated:
        return f"asr.train generates only {', '.join(generated)} itself"
    return (f"no installed package registers a corpus recipe (entry-point group {GROUP}), so asr.train "
            "generates no corpus itself; an install older than that group lacks the project's recipes: "
            "reinstall with `pip install --no-build-isolation -e .` (see .ci/install.sh)")

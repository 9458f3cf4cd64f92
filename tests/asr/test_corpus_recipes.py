"""The corpus-recipe seam: how asr reaches a recipe without importing recipes, and that a corpus is
one folder (its recipe) plus its configs: a toy corpus added from a temporary folder alone trains."""
from __future__ import annotations

import inspect
import json
import sys
import tomllib
from pathlib import Path

import pytest

import asr.data.corpus.corpus_recipes as corpus_recipes
import asr.training.fit
import recipes
from asr.config.schema import SynthCorpusConfig
from asr.core.errors import ConfigError
from asr.data.corpus.corpus_recipes import CorpusRecipe, corpus_recipe
from asr.data.corpus.manifests import ManifestError
from recipes.corpora import corpus_recipes as recipes_of_this_package
from tiny_runs import ROOT, TINY, compose_config

DATA_TESTS = Path(__file__).resolve().parent / "data"   # synthetic_corpus.py: a tiny corpus writer


def test_pyproject_registers_the_recipes_package_and_it_lists_every_corpus_folder():
    declared = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["entry-points"]
    assert declared[corpus_recipes.GROUP] == {"recipes": "recipes.corpora:corpus_recipes"}
    folders = {path.parent.name for path in (ROOT / "recipes").glob("*/__init__.py")}
    listed = {recipe.corpus for recipe in recipes_of_this_package()}
    # noise/ holds augmentation data and longform/ long recordings made from a corpus: neither is a corpus
    assert listed == folders - {"noise", "longform"}
    assert set(corpus_recipes.corpus_recipes()) == listed   # what asr reads through the entry point


def test_the_synth_preparer_takes_the_synth_corpus_options():
    recipe = corpus_recipe("synth")
    assert recipe.options_section == "synth_corpus"
    from recipes.synth.prepare import prepare_synth
    accepted = set(inspect.signature(prepare_synth).parameters)
    assert set(SynthCorpusConfig.__dataclass_fields__) | {"progress"} <= accepted


def recipe_with(preparer):
    return lambda corpus: (CorpusRecipe("synth", "python -m recipes.synth.prepare --out {root}", preparer,
                                        "synth_corpus") if corpus == "synth" else None)


def test_missing_manifests_call_the_recipes_preparer_with_root_and_options(tmp_path, monkeypatch):
    calls = []
    monkeypatch.setattr(asr.training.fit, "corpus_recipe", recipe_with(lambda root, **options: calls.append((root, options))))
    asr.training.fit.ensure_corpus(compose_config(f"data.root={tmp_path}", "synth_corpus.train_utterances=7",
                                           "synth_corpus.jobs=1"))
    assert calls == [(tmp_path, {"train_utterances": 7, "dev_utterances": 200, "test_utterances": 200,
                                 "seed": 0, "jobs": 1, "utterance_scale": 1, "extra_voices": None,
                                 "piper_share": None, "progress": True})]


def test_without_a_registered_recipe_missing_manifests_say_to_reinstall(tmp_path, monkeypatch):
    monkeypatch.setattr(corpus_recipes, "entry_points", lambda **selection: [])
    with pytest.raises(ConfigError) as error:
        asr.training.fit.ensure_corpus(compose_config(f"data.root={tmp_path / 'absent'}"))
    message = str(error.value)
    assert "does not exist, so it holds no synth manifests" in message
    assert "write them with a recipe for corpus 'synth' (recipes/README.md says how to add one)" in message
    assert f"entry-point group {corpus_recipes.GROUP}" in message and "pip install --no-build-isolation -e ." in message
    assert not Path(tmp_path / "absent").exists()


def test_a_preparer_refusing_an_option_or_folder_is_a_config_error(tmp_path, monkeypatch):
    def refusing(root, **options):
        raise ValueError(f"{root} holds a synthetic corpus made with other settings (extra_voices: None there, "
                         f"{options['extra_voices']!r} now); use another folder (--out; data.root in asr.train)")
    monkeypatch.setattr(asr.training.fit, "corpus_recipe", recipe_with(refusing))
    with pytest.raises(ConfigError) as error:
        asr.training.fit.ensure_corpus(compose_config(f"data.root={tmp_path}", "synth_corpus.extra_voices=festival"))
    assert str(error.value) == (f"corpus synth in data.root={str(tmp_path)!r}: {tmp_path} holds a synthetic corpus "
                                "made with other settings (extra_voices: None there, 'festival' now); use another "
                                "folder (--out; data.root in asr.train)")


# ---- a new corpus from a temporary folder ---------------------------------------------------------
TOY_RECIPE = '''"""A toy corpus: a few utterances of synthetic audio (tests/asr/data/synthetic_corpus.py)."""
from asr.data.corpus.corpus_recipes import CorpusRecipe


def generate(out_dir, progress=True):
    from synthetic_corpus import make_utterances, write_corpus
    write_corpus(out_dir, {{"train": make_utterances(6, 1, "tr"), "dev": make_utterances(2, 2, "dv"),
                           "test": make_utterances(2, 3, "te")}}, corpus="{corpus}")
    return {{"generated": "{corpus}"}}


RECIPE = CorpusRecipe("{corpus}", prepare_command="python -m recipes.{corpus}.prepare --out {{root}}",
                      preparer={preparer})
'''
TOY_SETUP = """# @package _global_
defaults:
  - override /model: synth
  - override /data: {corpus}
  - override /optim: synth
  - override /trainer: synth
"""


def add_toy_corpus(folder: Path, monkeypatch, corpus: str, generated: bool) -> Path:
    """recipes/<corpus>/__init__.py, conf/data/<corpus>.yaml and conf/conf/<corpus>.yaml, all under
    `folder`, which joins the recipes package's path and Hydra's config search path."""
    (folder / "recipes" / corpus).mkdir(parents=True)
    (folder / "recipes" / corpus / "__init__.py").write_text(
        TOY_RECIPE.format(corpus=corpus, preparer="generate" if generated else "None"))
    (folder / "conf" / "data").mkdir(parents=True)
    (folder / "conf" / "data" / f"{corpus}.yaml").write_text(
        f"corpus: {corpus}\nroot: {folder / 'data' / corpus}\ntargets: [phones, chars]\n")
    (folder / "conf" / "conf").mkdir(parents=True)
    (folder / "conf" / "conf" / f"{corpus}.yaml").write_text(TOY_SETUP.format(corpus=corpus))
    monkeypatch.setattr(recipes, "__path__", [*recipes.__path__, str(folder / "recipes")])
    monkeypatch.syspath_prepend(str(DATA_TESTS))
    for name in [name for name in sys.modules if name.startswith(f"recipes.{corpus}")]:
        monkeypatch.delitem(sys.modules, name)
    return folder / "data" / corpus


def test_a_toy_corpus_from_a_temporary_folder_is_prepared_and_trains(tmp_path, monkeypatch):
    data_root = add_toy_corpus(tmp_path / "new", monkeypatch, "toy", generated=True)
    assert corpus_recipe("toy").prepare_command == "python -m recipes.toy.prepare --out {root}"
    cfg = compose_config(f"hydra.searchpath=[file://{tmp_path / 'new' / 'conf'}]", "conf=toy", *TINY,
                         "trainer.max_steps=1")
    assert cfg.data.corpus == "toy" and cfg.model.subsampling == 2   # the toy's data config and setup
    results = asr.training.fit.train(cfg, tmp_path / "run")
    assert sorted(p.name for p in data_root.glob("toy_cuts_*.jsonl.gz")) == \
        ["toy_cuts_dev.jsonl.gz", "toy_cuts_test.jsonl.gz", "toy_cuts_train.jsonl.gz"]
    assert results["steps"] == 1 and "per" in json.loads((tmp_path / "run" / "results.json").read_text())["test"]


def test_a_toy_corpus_without_a_preparer_names_its_prepare_command(tmp_path, monkeypatch):
    add_toy_corpus(tmp_path / "new", monkeypatch, "toyreal", generated=False)
    cfg = compose_config(f"hydra.searchpath=[file://{tmp_path / 'new' / 'conf'}]", "conf=toyreal", *TINY,
                         f"data.root={tmp_path / 'nowhere'}")
    with pytest.raises(ConfigError, match=r"prepare them with `python -m recipes.toyreal.prepare --out "
                                          rf"{tmp_path / 'nowhere'}` \(see recipes/toyreal/README.md\)"):
        asr.training.fit.train(cfg, tmp_path / "run")
    with pytest.raises(ManifestError, match=r"python -m recipes.toyreal.prepare --out"):   # the data module too
        from asr.data.config import DataConfig
        from asr.data.datamodule import SpeechDataModule
        SpeechDataModule(DataConfig.of(cfg.data)).setup("fit")


def test_a_corpus_without_a_test_split_trains_with_test_false_and_is_refused_with_test_true(tmp_path):
    for split in ("train", "dev"):   # only their presence is checked here
        (tmp_path / f"mine_cuts_{split}.jsonl.gz").write_bytes(b"")
    asr.training.fit.ensure_corpus(compose_config(f"data.root={tmp_path}", "data.corpus=mine", "test=false"))
    with pytest.raises(ConfigError) as error:
        asr.training.fit.ensure_corpus(compose_config(f"data.root={tmp_path}", "data.corpus=mine", "test=true"))
    assert "has no mine_cuts_<split>.jsonl.gz for split(s) ['test']" in str(error.value)

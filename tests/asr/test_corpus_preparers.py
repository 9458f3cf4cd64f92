"""The corpus-preparer seam: how asr.train generates the built-in corpus without importing recipes."""
from __future__ import annotations

import inspect
import tomllib
from importlib import import_module
from pathlib import Path

import pytest

import asr.data.corpus_preparers as corpus_preparers
import asr.train
from asr.config import ConfigError, SynthCorpusConfig
from tiny_runs import ROOT, compose_config


def test_pyproject_registers_the_synth_preparer_and_it_takes_the_synth_corpus_options():
    declared = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["entry-points"]
    target = declared[corpus_preparers.GROUP]["synth"]
    module, function = target.split(":")
    preparer = getattr(import_module(module), function)
    accepted = set(inspect.signature(preparer).parameters)
    assert set(SynthCorpusConfig.__dataclass_fields__) | {"progress"} <= accepted


def test_missing_manifests_call_the_registered_preparer_with_root_and_options(tmp_path, monkeypatch):
    calls = []
    monkeypatch.setattr(asr.train, "corpus_preparer",
                        lambda corpus: (lambda root, **options: calls.append((corpus, root, options)))
                        if corpus == "synth" else None)
    asr.train.ensure_corpus(compose_config(f"data.root={tmp_path}", "synth_corpus.train_utterances=7",
                                           "synth_corpus.jobs=1"))
    assert calls == [("synth", tmp_path, {"train_utterances": 7, "dev_utterances": 200, "test_utterances": 200,
                                          "seed": 0, "jobs": 1, "utterance_scale": 1, "extra_voices": None,
                                          "progress": True})]


def test_without_a_registered_preparer_missing_manifests_name_the_recipe_and_the_reinstall(tmp_path, monkeypatch):
    monkeypatch.setattr(corpus_preparers, "entry_points", lambda **selection: [])
    with pytest.raises(ConfigError) as error:
        asr.train.ensure_corpus(compose_config(f"data.root={tmp_path / 'absent'}"))
    message = str(error.value)
    assert "does not exist, so it holds no synth manifests" in message
    assert "python -m recipes.synth.prepare --out" in message
    assert f"entry-point group {corpus_preparers.GROUP}" in message and "pip install --no-build-isolation -e ." in message
    assert not Path(tmp_path / "absent").exists()


def test_a_preparer_refusing_an_option_or_folder_is_a_config_error(tmp_path, monkeypatch):
    def refusing(root, **options):
        raise ValueError(f"{root} holds a synthetic corpus made with other settings (extra_voices: None there, "
                         f"{options['extra_voices']!r} now); use another folder (--out; data.root in asr.train)")
    monkeypatch.setattr(asr.train, "corpus_preparer", lambda corpus: refusing)
    with pytest.raises(ConfigError) as error:
        asr.train.ensure_corpus(compose_config(f"data.root={tmp_path}", "synth_corpus.extra_voices=festival"))
    assert str(error.value) == (f"corpus synth in data.root={str(tmp_path)!r}: {tmp_path} holds a synthetic corpus "
                                "made with other settings (extra_voices: None there, 'festival' now); use another "
                                "folder (--out; data.root in asr.train)")

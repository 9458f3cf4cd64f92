"""One `asr.train` start checks the data section once and resolves the corpus once, and hands both
down: the data module is built from the DataConfig the config check made and the corpus the run
resolved, not from the config's node again."""
from __future__ import annotations

from asr.data.config import DataConfig
from asr.data.corpus.corpus import Corpus
from asr.data.datamodule import SpeechDataModule
from asr.training.fit import train
from tiny_runs import tiny_config


def test_a_training_start_checks_the_data_section_once_and_resolves_the_corpus_once(tiny_synth, tmp_path,
                                                                                  monkeypatch):
    cfg = tiny_config(tiny_synth, "conf=synth_full", "test=false", "trainer.num_sanity_val_steps=0")
    made, checked, resolved, modules = [], [], [], []
    post_init, check_cache, corpus_of = DataConfig.__post_init__, DataConfig.check_feature_cache, Corpus.of.__func__
    module_init = SpeechDataModule.__init__

    def counted_post_init(self):
        made.append(self)
        post_init(self)

    def counted_check(self, *arguments, **options):
        checked.append(self)
        check_cache(self, *arguments, **options)

    def counted_corpus_of(cls, data):
        corpus = corpus_of(cls, data)
        resolved.append(corpus)
        return corpus

    def recorded_module(self, cfg, *args, **kwargs):
        module_init(self, cfg, *args, **kwargs)
        modules.append(self)

    monkeypatch.setattr(DataConfig, "__post_init__", counted_post_init)
    monkeypatch.setattr(DataConfig, "check_feature_cache", counted_check)
    monkeypatch.setattr(Corpus, "of", classmethod(counted_corpus_of))
    monkeypatch.setattr(SpeechDataModule, "__init__", recorded_module)

    results = train(cfg, tmp_path / "run")

    assert results["steps"] > 0
    assert len(made) == 1 and checked == made, "the data section is checked once per start"
    assert len(resolved) == 1, "the corpus is resolved once per start"
    [module] = modules
    assert module.cfg is made[0] and module.corpus is resolved[0], "the data module takes what the start made"
    assert resolved[0].root == tiny_synth and resolved[0].name == "synth"

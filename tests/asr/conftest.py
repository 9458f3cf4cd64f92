from pathlib import Path

import pytest

from asr.training.fit import ensure_corpus, train
from tiny_runs import compose_config, tiny_config


@pytest.fixture(scope="session")
def tiny_synth(tmp_path_factory) -> Path:
    """The built-in corpus at its smallest (6 / 2 / 2 utterances), made the way asr.train makes it."""
    root = tmp_path_factory.mktemp("synth")
    cfg = compose_config(f"data.root={root}", "synth_corpus.train_utterances=6", "synth_corpus.dev_utterances=2",
                         "synth_corpus.test_utterances=2", "synth_corpus.jobs=1")
    ensure_corpus(cfg)   # the manifests are missing: generates them
    for split in ("train", "dev", "test"):
        assert (root / f"synth_cuts_{split}.jsonl.gz").is_file()
    return root


@pytest.fixture(scope="session")
def ddp_corpus(tmp_path_factory) -> Path:
    """The built-in corpus with 6 / 5 / 1 utterances, for the multi-process runs (test_ddp*.py): with
    two processes or more, the dev split's last round and the single test utterance leave some
    process a padding batch."""
    root = tmp_path_factory.mktemp("synth_ddp")
    ensure_corpus(compose_config(f"data.root={root}", "synth_corpus.train_utterances=6",
                                 "synth_corpus.dev_utterances=5", "synth_corpus.test_utterances=1",
                                 "synth_corpus.jobs=1"))
    return root


@pytest.fixture(scope="session")
def tiny_epochs_run(tiny_synth, tmp_path_factory) -> Path:
    """A tiny synth_full run of three epochs that keeps every epoch's checkpoint (asr.average and
    asr.transcribe use it)."""
    run = tmp_path_factory.mktemp("three_epochs")
    train(tiny_config(tiny_synth, "conf=synth_full", "test=false", "trainer.max_epochs=3",
                      "trainer.keep_epoch_checkpoints=true"), run)
    return run

from pathlib import Path

import pytest

from asr.train import ensure_corpus
from tiny_runs import compose_config


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

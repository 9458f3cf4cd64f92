"""Fixtures of the data tests; the corpus writer itself is in synthetic_corpus.py."""

import logging

import pytest
from synthetic_corpus import make_utterances, write_corpus


@pytest.fixture
def tiny_corpus(tmp_path):
    """train 24, dev 6, test 6 utterances of 0.6-2.5 s in tmp_path/'tiny'."""
    root = tmp_path / "tiny"
    write_corpus(root, {"train": make_utterances(24, 1, "tr"), "dev": make_utterances(6, 2, "dv"),
                        "test": make_utterances(6, 3, "te")})
    return root


@pytest.fixture(autouse=True)
def _quiet_lhotse():
    logging.getLogger("lhotse").setLevel(logging.ERROR)

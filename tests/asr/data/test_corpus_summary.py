"""The corpus summary asr.train prints after generating a corpus, on a corpus whose numbers are counted by hand."""
from __future__ import annotations

import pytest
from synthetic_corpus import write_corpus

from asr.data.corpus.corpus import Corpus
from asr.data.corpus.corpus_summary import format_corpus_summary, summarise_split


def utterance(uid: str, duration: float, speaker: str, text: str) -> dict:
    return {"id": uid, "duration": duration, "speaker": speaker, "text": text, "phones": "dh ah"}


@pytest.fixture
def counted_corpus(tmp_path):
    """train: 1.5 + 2 + 0.5 s, speakers a b a, 7 words of 5 kinds; dev: 1 s, 2 words;
    test: 3 + 0.6 s, speakers c d, 6 words of which zebra and lazy are not in train."""
    return write_corpus(tmp_path / "counted", {
        "train": [utterance("t1", 1.5, "a", "the cat sat"), utterance("t2", 2.0, "b", "the dog"),
                  utterance("t3", 0.5, "a", "a cat")],
        "dev": [utterance("d1", 1.0, "c", "the mat")],
        "test": [utterance("e1", 3.0, "c", "the zebra sat"), utterance("e2", 0.6, "d", "a lazy dog")]})


def test_each_split_is_counted_from_its_manifest(counted_corpus):
    train = summarise_split(Corpus.at("tiny", counted_corpus), "train")
    assert (train.utterances, train.speakers, len(train.words), len(set(train.words))) == (3, 2, 7, 5)
    assert train.seconds == pytest.approx(4.0) and train.hours == pytest.approx(4.0 / 3600)
    test = summarise_split(Corpus.at("tiny", counted_corpus), "test")
    assert (test.utterances, test.speakers, test.words) == (2, 2, ["the", "zebra", "sat", "a", "lazy", "dog"])
    assert test.seconds == pytest.approx(3.6)


def test_the_summary_is_a_few_lines_with_the_share_of_test_words_training_never_saw(counted_corpus):
    splits = {name: summarise_split(Corpus.at("tiny", counted_corpus), name) for name in ("train", "dev", "test")}
    assert format_corpus_summary("tiny", splits, "train", "test") == [
        "corpus tiny: 6 utterances, 0.00 h",
        "  split   utterances   hours  speakers    words  distinct words",
        "  train            3    0.00         2        7               5",
        "  dev              1    0.00         1        2               2",
        "  test             2    0.00         2        6               6",
        "  vocabulary: 5 distinct words in train; 33.33% of the test words are not among them"]   # 2 of 6

"""A corpus in a few lines for the console: per split its utterances, hours, speakers and words,
and how many of the test words training never saw. asr.train prints it when it has just generated
a corpus (the recipe's full report, whose form is the recipe's own, goes to the run folder).

Read from the manifests, so it says the same for every recipe:

    corpus synth: 3400 utterances, 7.42 h
      split   utterances   hours  speakers    words  distinct words
      train         3000    6.56        32    63012           11850
      ...
      vocabulary: 11850 distinct words in train; 4.10% of the test words are not among them
"""
from __future__ import annotations

from dataclasses import dataclass

from lhotse import CutSet

from asr.data.corpus.corpus import Corpus


@dataclass
class SplitSummary:
    utterances: int
    seconds: float
    speakers: int
    words: list[str]          # every word of every transcript, in order

    @property
    def hours(self) -> float:
        return self.seconds / 3600


def summarise_split(corpus: Corpus, split: str) -> SplitSummary:
    """The split's utterances, audio duration, speakers and transcript words, from its cuts manifest."""
    seconds, speakers, words, utterances = 0.0, set(), [], 0
    for cut in CutSet.from_file(corpus.cuts_path(split)):
        utterances += 1
        seconds += cut.duration
        for supervision in cut.supervisions:
            speakers.add(supervision.speaker)
            words += (supervision.text or "").split()
    return SplitSummary(utterances, seconds, len(speakers), words)


def format_corpus_summary(corpus: str, splits: dict[str, SplitSummary], train_split: str,
                          test_split: str) -> list[str]:
    """The lines asr.train prints: a total, one row per split, the training vocabulary and the
    share of test word tokens outside it (what no model trained on the split can spell from it)."""
    total_hours = sum(split.hours for split in splits.values())
    lines = [f"corpus {corpus}: {sum(split.utterances for split in splits.values())} utterances, {total_hours:.2f} h",
             f"  {'split':<8}{'utterances':>10}{'hours':>8}{'speakers':>10}{'words':>9}{'distinct words':>16}"]
    for name, split in splits.items():
        lines.append(f"  {name:<8}{split.utterances:>10}{split.hours:>8.2f}{split.speakers:>10}"
                     f"{len(split.words):>9}{len(set(split.words)):>16}")
    if train_split in splits and test_split in splits and splits[test_split].words:
        vocabulary = set(splits[train_split].words)
        test_words = splits[test_split].words
        unseen = sum(word not in vocabulary for word in test_words) / len(test_words)
        lines.append(f"  vocabulary: {len(vocabulary)} distinct words in {train_split}; {100 * unseen:.2f}% of the "
                     f"{test_split} words are not among them")
    return lines

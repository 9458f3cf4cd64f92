"""How the duration-bucketing sampler splits every split over DDP processes (asr.data.batching.duration_buckets).

Without processes: each rank's sampler is built with an explicit rank and world size, and the
ranks' batches are put side by side as DDP would run them.
"""
from collections import Counter
from types import SimpleNamespace

import pytest
from lhotse import CutSet
from lhotse.testing.dummies import dummy_cut
from synthetic_corpus import make_utterances, write_corpus

from asr.data.batching.duration_buckets import duration_bucketing_sampler, share_last_round
from asr.data.config import DataConfig
from asr.data.datamodule import SpeechDataModule


def cuts_of(durations: list[float]) -> CutSet:
    return CutSet.from_cuts([dummy_cut(i, duration=d) for i, d in enumerate(durations)])


def batches_per_rank(cuts: CutSet, world_size: int, epoch: int, shuffle: bool, max_duration: float = 7.0):
    per_rank = []
    for rank in range(world_size):
        sampler = duration_bucketing_sampler(cuts, max_duration, 3, shuffle=shuffle, seed=5, rank=rank,
                                             world_size=world_size)
        sampler.set_epoch(epoch)
        per_rank.append(list(sampler))
    return per_rank


DURATIONS = {
    "11 mixed": [1 + (i * 37 % 10) / 3 for i in range(11)],
    "3 short": [1.0, 1.5, 2.0],
    "2 short": [1.0, 1.5],
    "1": [2.5],
    "30 mixed": [0.5 + (i * 53 % 13) / 2 for i in range(30)],
}


@pytest.mark.parametrize("world_size", [1, 2, 3, 4])
@pytest.mark.parametrize("corpus", sorted(DURATIONS))
@pytest.mark.parametrize("shuffle", [False, True])
def test_every_utterance_once_over_all_ranks_in_step_and_within_the_cap(world_size, corpus, shuffle):
    cuts = cuts_of(DURATIONS[corpus])
    durations = {cut.id: cut.duration for cut in cuts}
    for epoch in (0, 1):
        per_rank = batches_per_rank(cuts, world_size, epoch, shuffle)
        # DDP runs one batch per rank per step: every rank must have as many batches
        assert len({len(batches) for batches in per_rank}) == 1
        counted = Counter(cut.id for batches in per_rank for batch in batches if not batch.padding
                          for cut in batch.cuts)
        assert counted == Counter(durations.keys())    # each utterance exactly once, none dropped
        for batches in per_rank:
            for index, batch in enumerate(batches):
                lengths = [durations[cut.id] for cut in batch.cuts]
                assert lengths and len(lengths) * max(lengths) <= 7.0
                if batch.padding:   # only a rank's last batch, one utterance
                    assert index == len(batches) - 1 and len(lengths) == 1
        # a rank gets a padding batch only when its epoch's last round has fewer utterances than ranks
        last_round = [batches[-1] for batches in per_rank]
        real = sum(len(batch.cuts) for batch in last_round if not batch.padding)
        assert sum(batch.padding for batch in last_round) == max(0, world_size - real)


def test_training_order_is_reshuffled_per_epoch_and_the_same_on_every_rank():
    cuts = cuts_of(DURATIONS["30 mixed"])
    first, second = batches_per_rank(cuts, 2, 0, True), batches_per_rank(cuts, 2, 1, True)
    assert [[c.id for c in b.cuts] for b in first[0]] != [[c.id for c in b.cuts] for b in second[0]]
    again = batches_per_rank(cuts, 2, 0, True)
    assert [[[c.id for c in b.cuts] for b in batches] for batches in again] == \
        [[[c.id for c in b.cuts] for b in batches] for batches in first]


def test_last_round_is_split_without_merging_batches():
    a, b, c, d = (dummy_cut(i, duration=1.0) for i in range(4))
    ids = lambda shares: [([cut.id for cut in cuts], padding) for cuts, padding in shares]   # noqa: E731
    batches = [CutSet.from_cuts([a, b, c]), CutSet.from_cuts([d])]
    # [a b c] [d] -> halve the largest: [a b] [c] [d] -> [a] [b] [c] [d]
    assert ids(share_last_round(batches, 3)) == [([a.id, b.id], False), ([c.id], False), ([d.id], False)]
    assert ids(share_last_round(batches, 4)) == [([a.id], False), ([b.id], False), ([c.id], False),
                                                  ([d.id], False)]
    assert ids(share_last_round(batches, 6)) == [([a.id], False), ([b.id], False), ([c.id], False),
                                                  ([d.id], False), ([a.id], True), ([a.id], True)]


def test_a_bad_rank_is_refused():
    with pytest.raises(ValueError, match=r"rank=2 must lie in \[0, world_size=2\)"):
        duration_bucketing_sampler(cuts_of([1.0]), 7.0, 1, shuffle=False, seed=0, rank=2, world_size=2)


def test_data_module_serves_each_rank_its_share_of_every_split(tmp_path):
    """The data module takes rank and world size from the Trainer it is attached to."""
    utterances = {"train": make_utterances(9, 1, "tr"), "dev": make_utterances(5, 2, "dv")}
    root = write_corpus(tmp_path / "c", utterances)
    config = DataConfig(root=str(root), corpus="tiny", targets=["phones"], max_duration=4.0, num_buckets=2,
                        progress=False)
    seen = {"train": Counter(), "dev": Counter()}
    steps = {"train": set(), "dev": set()}
    for rank in range(2):
        module = SpeechDataModule(config, seed=1)
        module.trainer = SimpleNamespace(global_rank=rank, world_size=2)
        assert module.process_rank() == (rank, 2)
        module.setup("fit")
        for split, loader in (("train", module.train_dataloader()), ("dev", module.val_dataloader())):
            batches = list(loader)
            steps[split].add(len(batches))
            for batch in batches:
                if not batch["padding"]:
                    seen[split].update(batch["ids"])
    assert len(steps["train"]) == 1 and len(steps["dev"]) == 1      # in step
    for split in ("train", "dev"):   # every utterance of the manifest exactly once
        assert seen[split] == Counter(utterance["id"] for utterance in utterances[split])
    assert SpeechDataModule(config).process_rank() == (0, 1)      # alone, no Trainer

"""The streaming data path: shards prepared once (asr.data.streaming.stream_shards) and batched window by
window (asr.data.batching.stream_sampler), checked against the manifest and the eager path on a tiny corpus
whose every cut, duration and transcript is known."""
from __future__ import annotations

import gzip
import json
import os
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
import torch
from lhotse import load_manifest
from synthetic_corpus import make_utterances, write_corpus

from asr.data.config import DataConfig

from asr.data.datamodule import SpeechDataModule
from asr.data.features.feature_cache import feature_directory
from asr.data.features.features import FilterBank
from asr.data.corpus.manifests import ManifestError, cuts_path
from asr.data.batching.stream_sampler import StreamingBucketSampler, plan_buckets
from asr.data.streaming.stream_preparation import prepare_stream
from asr.data.streaming.stream_shards import StreamIndex, read_records, shard_name, stream_folder

SHARD_CUTS = 5
MAX_DURATION = 8.0


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> Path:
    """train 43 utterances (9 shards of 5, the last of 3), dev 6, test 6, of 0.6-2.5 s."""
    root = tmp_path_factory.mktemp("streaming") / "tiny"
    write_corpus(root, {"train": make_utterances(43, 1, "tr"), "dev": make_utterances(6, 2, "dv"),
                        "test": make_utterances(6, 3, "te")})
    return root


def prepared(root: Path, split: str = "train", folder: Path | None = None, **options) -> StreamIndex:
    folder = folder or stream_folder(feature_directory(root / "features", FilterBank(40)) / split)
    return prepare_stream(cuts_path(root, "tiny", split), root, folder, FilterBank(40), SHARD_CUTS, progress=False,
                          **options)


@pytest.fixture(scope="module")
def index(corpus) -> StreamIndex:
    return prepared(corpus)


def every_record(index: StreamIndex) -> list[list]:
    return [record for shard in range(index.shards) for record in read_records(index.folder, shard)]


# ----- preparation ----------------------------------------------------------------------------------
def test_the_shards_hold_every_cut_of_the_manifest_with_its_duration_and_transcripts(corpus, index):
    cuts = {cut.id: cut for cut in load_manifest(cuts_path(corpus, "tiny", "train"))}
    records = every_record(index)
    assert [r[0] for r in records] == list(cuts)     # manifest order, shard k = cuts 5k..5k+4
    assert index.shards == 9 and index.cuts == 43 and index.shard_cuts == SHARD_CUTS
    for cut_id, duration, frames, _, _, text, phones in records:
        cut = cuts[cut_id]
        assert duration == pytest.approx(cut.duration, abs=1e-6)
        assert frames == FilterBank(40).num_frames(cut.num_samples)
        assert (text, phones) == (cut.supervisions[0].text, cut.supervisions[0].custom["phones"])
    assert index.hours == pytest.approx(sum(c.duration for c in cuts.values()) / 3600)
    histogram = index.total_histogram()
    assert histogram.sum() == 43 and histogram[int(np.ceil(max(c.duration for c in cuts.values()) / 0.1)) - 1] >= 1


def test_features_and_statistics_are_the_eager_paths(corpus, index):
    eager = SpeechDataModule(DataConfig(corpus="tiny", root=str(corpus), streaming=False, progress=False,
                                        cache_dir=str(corpus / "eager")))
    eager.setup("fit")
    streamed = SpeechDataModule(DataConfig(corpus="tiny", root=str(corpus), streaming=True, progress=False,
                                           stream_shard_cuts=SHARD_CUTS))
    train = streamed.split("train")
    cuts = {cut.id: cut for cut in eager.split("train").cuts}
    for shard in range(index.shards):
        for cut in index.cuts_of(shard):
            assert torch.equal(train.features.load(cut), eager.split("train").features.load(cuts[cut.id]))
    # the eager statistics are over every frame of a split this small: the same numbers
    assert torch.allclose(streamed.feature_mean, eager.feature_mean, atol=1e-5)
    assert torch.allclose(streamed.feature_std, eager.feature_std, atol=1e-5)
    assert {k: t.state_dict() for k, t in streamed.tokenizers.items()} == \
        {k: t.state_dict() for k, t in eager.tokenizers.items()}


def test_preparation_resumes_shard_by_shard_and_redoes_a_changed_manifest(tmp_path):
    corpus = write_corpus(tmp_path / "tiny", {"train": make_utterances(43, 1, "tr")})
    folder = tmp_path / "stream"
    first = prepared(corpus, folder=folder)
    (folder / "index.json").unlink()
    (folder / f"{shard_name(4)}.json").unlink()          # shard 4 as if interrupted before its summary
    times = {path.name: path.stat().st_mtime_ns for path in folder.glob("shard-*.lilcom")}
    again = prepared(corpus, folder=folder)
    assert again.index == first.index
    changed = [name for name, mtime in times.items() if (folder / name).stat().st_mtime_ns != mtime]
    assert changed == [f"{shard_name(4)}.lilcom"]
    # the manifest rewritten (same cuts, a new file): its shards are stale and redone
    manifest = cuts_path(corpus, "tiny", "train")
    os.utime(manifest, ns=(manifest.stat().st_atime_ns, manifest.stat().st_mtime_ns + 10**9))
    assert StreamIndex.open(folder, manifest) is None
    redone = prepared(corpus, folder=folder)
    assert redone.cuts == 43 and all((folder / n).stat().st_mtime_ns != t for n, t in times.items())


def test_bad_audio_stops_with_every_utterance_named_or_is_left_out_and_counted(tmp_path):
    root = tmp_path / "tiny"
    write_corpus(root, {"train": make_utterances(12, 1, "tr")})
    (root / "audio" / "tr0003.flac").unlink()
    (root / "audio" / "tr0008.flac").write_bytes(b"not audio")
    with pytest.raises(ManifestError, match=r"2 utterances have missing or unusable audio: tr0003 \(.*not found.*"
                                            r"tr0008 .*data.skip_bad_audio=true"):
        prepared(root)
    index = prepared(root, skip_bad_audio=True)   # the shards written above are kept, the index now written
    assert index.cuts == 10 and index.index["dropped"] == {"bad_audio": 2}
    assert "tr0003" not in {r[0] for r in every_record(index)}


def test_a_duplicated_id_is_an_error_naming_it(tmp_path):
    root = tmp_path / "tiny"
    utterances = make_utterances(8, 1, "tr")
    utterances[6] = dict(utterances[1])    # in another shard (cuts 5-7)
    write_corpus(root, {"train": utterances})
    with pytest.raises(ManifestError, match="1 utterance ids appear more than once.*tr0001"):
        prepared(root)


# ----- the sampler ----------------------------------------------------------------------------------
def sampler(index, world_size=1, rank=0, window_shards=2, shuffle=True, seed=3):
    return StreamingBucketSampler(index, plan_buckets(index, 4, MAX_DURATION), shuffle, seed, rank, world_size,
                                  window_shards)


def real_ids(batches) -> list[str]:
    return [cut.id for batch in batches if not batch.padding for cut in batch.cuts]


def test_one_epoch_gives_every_cut_once_in_batches_under_the_duration_cap(index):
    one = sampler(index)
    batches = list(one)
    assert sorted(real_ids(batches)) == sorted(r[0] for r in every_record(index))
    assert not any(batch.padding for batch in batches)
    assert len(batches) == one.estimated_batches()
    for batch in batches:
        assert len(batch.cuts) * max(cut.duration for cut in batch.cuts) <= MAX_DURATION
    one.set_epoch(1)
    assert real_ids(list(one)) != real_ids(batches)              # another epoch, another order
    assert real_ids(list(sampler(index))) == real_ids(batches)   # the same seed and epoch: the same batches


def test_buckets_follow_the_histogram_and_fail_clearly_when_a_batch_cannot_hold_the_longest(index):
    buckets = plan_buckets(index, 4, MAX_DURATION)
    assert list(buckets.bounds) == sorted(buckets.bounds) and buckets.bounds[-1] >= 2.5 - 0.1
    assert buckets.shard_counts.sum() == 43 and buckets.shard_counts.shape == (9, len(buckets.bounds))
    assert all(rows == int(MAX_DURATION // bound) for rows, bound in zip(buckets.rows, buckets.bounds))
    with pytest.raises(ValueError, match="data.max_duration=2.0 s cannot hold"):
        plan_buckets(index, 4, 2.0)


@pytest.mark.parametrize("world_size", [2, 3, 7])
def test_processes_take_disjoint_windows_the_same_number_of_steps_and_cover_the_epoch(index, world_size):
    samplers = [sampler(index, world_size, rank) for rank in range(world_size)]
    per_rank = [list(s) for s in samplers]
    assert len({len(batches) for batches in per_rank}) == 1     # in step
    assert len(per_rank[0]) == samplers[0].estimated_batches()
    seen = Counter(cut_id for batches in per_rank for cut_id in real_ids(batches))
    assert seen == Counter(r[0] for r in every_record(index))    # every cut exactly once
    windows, counts = samplers[0].epoch_plan(0)
    shares = samplers[0].shares(np.zeros_like(counts), counts)
    for rank, batches in enumerate(per_rank):                      # only its own windows' shards
        own = {int(shard) for window in shares[rank] for shard in windows[window]}
        assert {cut.shard for batch in batches if not batch.padding for cut in batch.cuts} <= own


@pytest.mark.parametrize("before, after, steps", [(1, 1, 3), (2, 2, 4), (2, 3, 2), (3, 1, 5), (1, 4, 7), (2, 1, 0)])
def test_a_resumed_epoch_trains_exactly_the_batches_not_done_on_any_process_count(index, before, after, steps):
    first = [sampler(index, before, rank) for rank in range(before)]
    done = [batch for s in first for batch in list(s)[:steps]]
    position = first[0].position_after(steps)
    assert all(s.position_after(steps) == position for s in first)   # every process computes the same
    rest = []
    for rank in range(after):
        resumed = sampler(index, after, rank)
        resumed.resume_at(position)
        rest.append(list(resumed))
    assert len({len(batches) for batches in rest}) == 1
    seen = Counter(real_ids(done)) + Counter(cut_id for batches in rest for cut_id in real_ids(batches))
    assert seen == Counter(r[0] for r in every_record(index))
    # a position saved in a resumed epoch counts from the epoch's start
    resumed = sampler(index, after, 0)
    resumed.resume_at(position)
    assert resumed.position_after(steps + len(rest[0])) is None
    if len(rest[0]) > 1:
        later = resumed.position_after(steps + 1)
        assert later["steps"] == steps + 1 and sum(later["consumed"]) == sum(position["consumed"]) + after


def test_a_position_that_does_not_fit_the_split_is_refused(index):
    with pytest.raises(ValueError, match="stream position does not fit"):
        sampler(index).resume_at({"epoch": 0, "consumed": [0, 0], "steps": 0})


def test_without_shuffling_the_shards_and_buckets_keep_their_order(index):
    batches = list(sampler(index, shuffle=False))
    shards = [cut.shard for batch in batches for cut in batch.cuts]
    windows = [shard // 2 for shard in shards]
    assert windows == sorted(windows)


# ----- the data module ------------------------------------------------------------------------------
def streamed_module(corpus, **options) -> SpeechDataModule:
    config = dict(corpus="tiny", root=str(corpus), progress=False, stream_shard_cuts=SHARD_CUTS,
                  stream_window_shards=2, max_duration=MAX_DURATION, **options)
    return SpeechDataModule(DataConfig.of(config), frame_subsampling=2)


def test_auto_streams_a_corpus_whose_shards_are_prepared_and_options_it_cannot_take_are_named(corpus, index, tmp_path):
    other = tmp_path / "other"
    write_corpus(other, {"train": make_utterances(6, 5, "o")})
    assert not streamed_module(other).streaming                    # small, nothing prepared: eager
    module = streamed_module(corpus)
    module.setup("fit")   # the index fixture prepared the training split's shards
    assert module.streaming and module.report()["train"]["utterances"] == 43
    assert not streamed_module(corpus, max_train_utterances=4).streaming   # auto: the option the user set wins
    with pytest.raises(ValueError, match="does not take data.max_train_utterances=4"):
        streamed_module(corpus, streaming=True, max_train_utterances=4).setup("fit")
    with pytest.raises(ValueError, match=r"data.augment.speed=\[0.9, 1.0, 1.1\]"):
        streamed_module(corpus, streaming=True, augment={"speed": [0.9, 1.0, 1.1]}).setup("fit")


class FakeTrainer:
    """What the data module reads of Lightning's trainer when it saves its state."""

    def __init__(self, processed: int):
        progress = type("Progress", (), {"processed": processed})()
        self.fit_loop = type("Loop", (), {"epoch_loop": type("Epoch", (), {
            "batch_progress": type("Batch", (), {"current": progress})()})()})()
        self.global_rank, self.world_size = 0, 1


def test_the_checkpointed_position_resumes_the_loader_where_training_stopped(corpus, index):
    module = streamed_module(corpus, streaming=True)
    module.setup("fit")
    loader = module.train_dataloader()
    batches = [batch["ids"] for batch in loader]
    module.trainer = FakeTrainer(processed=3)
    state = module.state_dict()
    assert state["next_train_epoch"] == 0 and state["stream_position"]["steps"] == 3
    resumed = streamed_module(corpus, streaming=True)
    resumed.load_state_dict(state)
    resumed.setup("fit")
    assert [batch["ids"] for batch in resumed.train_dataloader()] == batches[3:]
    module.trainer = FakeTrainer(processed=len(batches))          # the epoch done: the next one
    assert module.state_dict() == {"next_train_epoch": 1, "stream_position": None}


def test_a_training_batch_leaves_out_what_ctc_cannot_align(tmp_path):
    root = tmp_path / "tiny"
    utterances = make_utterances(6, 1, "tr", min_duration=0.7, max_duration=0.8)
    utterances[2]["phones"] = " ".join(["AA", "B"] * 40)          # 80 phones in 0.8 s: too many for 4x subsampling
    write_corpus(root, {"train": utterances, "dev": make_utterances(2, 2, "dv")})
    module = SpeechDataModule(DataConfig(corpus="tiny", root=str(root), streaming=True, progress=False,
                                         max_duration=MAX_DURATION), frame_subsampling=4)
    module.setup("fit")
    ids = [cut_id for batch in module.train_dataloader() if not batch["padding"] for cut_id in batch["ids"]]
    assert sorted(ids) == sorted(u["id"] for u in utterances if u["id"] != "tr0002")
    dev = [cut_id for batch in module.val_dataloader() for cut_id in batch["ids"]]
    assert sorted(dev) == ["dv0000", "dv0001"]


def test_the_command_prepares_every_split_and_says_what_it_wrote(corpus, tmp_path, capsys):
    from asr.prepare_shards import main

    cache = tmp_path / "cache"
    assert main([f"root={corpus}", "corpus=tiny", f"cache_dir={cache}", "stream_shard_cuts=5", "progress=false"]) == 0
    out = capsys.readouterr().out
    assert "train: 43 utterances" in out and "9 shards" in out and "dev: 6 utterances" in out and "test: 6" in out
    assert len(list(cache.glob("*/train/stream/shard-*.json"))) == 9
    assert main([f"root={corpus}", "corpus=tiny", "shard_cutz=5"]) == 2
    assert "shard_cutz" in capsys.readouterr().err
    with gzip.open(cuts_path(corpus, "tiny", "train"), "rt") as f:
        assert sum(1 for _ in f) == 43
    assert json.loads((next(cache.glob("*/train/stream")) / "index.json").read_text())["shards"] == 9


def test_a_damaged_shard_is_named_with_what_to_do_and_its_summary_removed_redoes_it(tmp_path):
    corpus = write_corpus(tmp_path / "tiny", {"train": make_utterances(12, 1, "tr")})
    folder = tmp_path / "stream"
    index = prepared(corpus, folder=folder)
    records = folder / f"{shard_name(1)}.cuts.jsonl.gz"
    records.write_bytes(records.read_bytes()[:40])
    with pytest.raises(ManifestError, match=r"cannot read the records of .*shard-000001.cuts.jsonl.gz.*delete "
                                            r".*shard-000001.json and run python -m asr.prepare_shards"):
        list(sampler(index))
    (folder / f"{shard_name(1)}.json").unlink()
    (folder / "index.json").write_text("{ damaged")
    assert sorted(real_ids(sampler(prepared(corpus, folder=folder)))) == [f"tr{i:04d}" for i in range(12)]


def test_a_scaled_stream_repeats_the_shards_under_new_ids_with_the_same_frames(index, tmp_path):
    from asr.benchmarks.scaled_corpus import copy_id, replicate_stream

    hours = 2.5 * index.hours
    scaled = replicate_stream(index.folder, tmp_path / "scaled", hours)
    assert scaled["shards"] == 23 and scaled["seconds"] >= hours * 3600   # 2 copies of 9 shards and 5 of the third
    copy = StreamIndex.open(tmp_path / "scaled")
    records = every_record(copy)
    assert len(records) == copy.cuts == 2 * 43 + 25 and len({r[0] for r in records}) == len(records)
    source = {r[0]: r for r in every_record(index)}
    assert records[43][0] == copy_id(records[0][0].rsplit("-x", 1)[0], 1)
    for record in records[::7]:
        original = source[record[0].rsplit("-x", 1)[0]]
        assert record[1:] == original[1:]                                   # duration, frames, offsets, words
    first, again = next(iter(copy.cuts_of(0))), next(iter(copy.cuts_of(9)))
    from asr.data.streaming.stream_shards import StreamedFeatures
    assert torch.equal(StreamedFeatures(copy.folder).load(first), StreamedFeatures(copy.folder).load(again))
    assert (tmp_path / "scaled" / "shard-000009.lilcom").stat().st_ino == (index.folder / "shard-000000.lilcom").stat().st_ino
    assert sorted(real_ids(sampler(copy))) == sorted(r[0] for r in records)

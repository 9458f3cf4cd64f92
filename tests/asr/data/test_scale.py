"""The data side at scale (asr/RESULTS.md, "Scale"): the one-pass manifest reading, the statistics
sample, per-batch targets and the scaled corpus equal what the eager, every-frame ways give."""

import gzip
import json
import os

import numpy as np
import pytest
import soundfile
from lhotse import CutSet

from asr.data.features import feature_stats
from asr.data.config import DataConfig
from asr.data.datamodule import SpeechDataModule
from asr.data.features.feature_cache import FeatureStore, feature_directory, precompute_features
from asr.data.features.feature_stats import statistics_sample
from asr.data.features.features import FilterBank
from asr.data.corpus.manifests import ManifestError, cuts_path, load_cuts
from asr.benchmarks.scaled_corpus import copy_id, replicate_feature_cache, write_scaled_cuts


def config(root, **overrides):
    options = dict(corpus="tiny", root=str(root), max_duration=8.0, progress=False, targets=["phones", "chars"])
    options.update(overrides)
    return DataConfig(**options)


def test_one_pass_loading_equals_the_eager_manifest_with_absolute_paths(tiny_corpus):
    eager = list(CutSet.from_file(cuts_path(tiny_corpus, "tiny", "train")))
    loaded = list(load_cuts(tiny_corpus, "tiny", "train", need_phones=True))
    assert [c.id for c in loaded] == [c.id for c in eager] and len(loaded) == 24
    for ours, theirs in zip(loaded, eager):
        path = theirs.recording.sources[0].source
        expected = path if os.path.isabs(path) else str(tiny_corpus / path)
        assert ours.recording.sources[0].source == expected
        assert ours.supervisions[0].to_dict() == theirs.supervisions[0].to_dict()
        assert (ours.duration, ours.recording.num_samples) == (theirs.duration, theirs.recording.num_samples)
    assert [c.id for c in load_cuts(tiny_corpus, "tiny", "train", need_phones=True, limit=5)] == \
        [c.id for c in eager[:5]]


def test_loading_still_names_every_cut_without_phones(tiny_corpus):
    path = cuts_path(tiny_corpus, "tiny", "train")
    lines = gzip.open(path, "rt").read().splitlines()
    broken = []
    for i, line in enumerate(lines):
        cut = json.loads(line)
        if i in (3, 9):
            del cut["supervisions"][0]["custom"]["phones"]
        broken.append(json.dumps(cut))
    with gzip.open(path, "wt") as f:
        f.write("\n".join(broken) + "\n")
    with pytest.raises(ManifestError, match=r"no supervision.custom\['phones'\]: tr0003, tr0009;"):
        load_cuts(tiny_corpus, "tiny", "train", need_phones=True)


def test_statistics_sample_is_every_cut_up_to_its_size_then_evenly_spaced():
    assert statistics_sample(range(7), 7) == list(range(7))
    assert statistics_sample(range(24), 6) == [0, 4, 8, 12, 16, 20]
    assert statistics_sample(range(10), 4) == [0, 2, 5, 7]


@pytest.mark.parametrize("precompute", [True, False])
def test_statistics_of_a_split_larger_than_the_sample_are_those_of_the_sampled_utterances(
        tiny_corpus, monkeypatch, precompute):
    monkeypatch.setattr(feature_stats, "STATS_SAMPLE_CUTS", 6)
    module = SpeechDataModule(config(tiny_corpus, precompute_features=precompute))
    module.setup("fit")
    filterbank = FilterBank(40)
    sampled = [f"tr{i:04d}" for i in (0, 4, 8, 12, 16, 20)]   # every 4th of the 24 training utterances
    frames = np.concatenate([filterbank(soundfile.read(tiny_corpus / "audio" / f"{name}.flac", dtype="float64")[0])
                             .numpy() for name in sampled]).astype(np.float64)
    assert module.feature_stats.num_frames == len(frames)
    np.testing.assert_allclose(module.feature_mean.numpy(), frames.mean(axis=0), atol=2e-3)
    np.testing.assert_allclose(module.feature_std.numpy(), frames.std(axis=0), atol=2e-3)


def test_batch_targets_are_the_tokenizers_ids_of_each_transcript(tiny_corpus):
    module = SpeechDataModule(config(tiny_corpus))
    module.setup("fit")
    phones, chars = module.tokenizers["phones"], module.tokenizers["chars"]
    seen = 0
    for batch in module.train_dataloader():
        for i, (phone_string, text) in enumerate(zip(batch["phones"], batch["texts"])):
            expected_phones = [phones.symbols.index(p) + 1 for p in phone_string.split()]
            expected_chars = [chars.symbols.index(c) + 1 for c in text]
            assert batch["targets"]["phones"][i, :len(expected_phones)].tolist() == expected_phones
            assert batch["target_lengths"]["phones"][i] == len(expected_phones)
            assert batch["targets"]["chars"][i, :len(expected_chars)].tolist() == expected_chars
            assert batch["target_lengths"]["chars"][i] == len(expected_chars)
        seen += len(batch["ids"])
    assert seen == 24


def test_a_scaled_split_repeats_the_source_under_new_ids_and_its_cache_gives_the_source_features(tiny_corpus, tmp_path):
    source = list(load_cuts(tiny_corpus, "tiny", "train", need_phones=True))
    seconds = sum(c.duration for c in source)
    hours = 2.5 * seconds / 3600          # two copies and half of a third
    out = tmp_path / "scaled"
    out.mkdir()
    scaled = write_scaled_cuts(cuts_path(tiny_corpus, "tiny", "train"), cuts_path(out, "scale", "train"), hours,
                               tiny_corpus)
    written = list(CutSet.from_file(cuts_path(out, "scale", "train")))
    running = np.cumsum([c.duration for c in source])
    partial = int(np.searchsorted(running, 0.5 * seconds - 1e-9) + 1)   # the cuts that reach the last half
    assert (scaled.copies, scaled.last_copy_cuts, scaled.cuts) == (3, partial, 2 * 24 + partial)
    assert [c.id for c in written] == [copy_id(c.id, k) for k in range(3) for c in source][:scaled.cuts]
    assert abs(scaled.seconds - sum(c.duration for c in written)) < 1e-6 and scaled.seconds >= hours * 3600
    for cut in written[:24] + written[48:]:
        original = source[int(cut.id.split("-x")[0][2:])]
        assert cut.supervisions[0].id == cut.id and cut.recording.id == cut.id
        assert cut.recording.sources[0].source == original.recording.sources[0].source   # the same audio
        assert cut.supervisions[0].text == original.supervisions[0].text
    filterbank = FilterBank(40)
    base = feature_directory(tmp_path / "base", filterbank) / "train"
    store, failures = precompute_features(source, filterbank, base, progress=False)
    assert not failures
    replicate_feature_cache(base, out / "cache", scaled, [c.id for c in source])
    replica = FeatureStore(out / "cache", 40)
    assert sorted(replica.index) == sorted(c.id for c in written)
    loaded = load_cuts(out, "scale", "train", need_phones=True)
    shards = sorted((out / "cache").iterdir())
    precompute_features(loaded, filterbank, out / "cache", progress=False)
    assert sorted((out / "cache").iterdir()) == shards   # nothing recomputed: the replica is the cache it needs
    for cut in written[::7]:
        np.testing.assert_array_equal(replica.load(cut.id), store.load(cut.id.split("-x")[0]))


def test_scale_benchmark_refuses_bad_sizes_and_a_folder_without_manifests(tmp_path, capsys):
    from asr.benchmarks import scale as scale_benchmark

    assert scale_benchmark.main(["--hours", "0", "--scratch", str(tmp_path)]) == 2
    assert scale_benchmark.main(["--source", str(tmp_path / "nothing"), "--scratch", str(tmp_path / "s")]) == 2
    errors = capsys.readouterr().err.strip().splitlines()
    assert len(errors) == 2 and errors[0].startswith("asr.benchmarks.scale: error: --hours")
    assert errors[1].startswith("asr.benchmarks.scale: error: manifest ")

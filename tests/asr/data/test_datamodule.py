import os

import kaldi_native_fbank as knf
import numpy as np
import pytest
import soundfile
import torch
from synthetic_corpus import make_utterances, write_corpus

from asr.data.features import feature_cache
from asr.data.config import DataConfig
from asr.data.datamodule import SpeechDataModule
from asr.data.features.features import FilterBank
from asr.data.corpus.manifests import ManifestError
from asr.text.phones import ARPABET_39


def config(root, **overrides):
    options = dict(corpus="tiny", root=str(root), max_duration=8.0, progress=False, feature_jobs=1)
    options.update(overrides)
    return DataConfig(**options)


def kaldi_frames(path):
    """Reference features straight from the file with kaldi-native-fbank."""
    audio, rate = soundfile.read(path, dtype="float64")
    options = knf.FbankOptions()
    options.frame_opts.dither = 0.0
    options.mel_opts.num_bins = 40
    computer = knf.OnlineFbank(options)
    computer.accept_waveform(rate, (audio * 32768).tolist())
    computer.input_finished()
    return np.array([computer.get_frame(i) for i in range(computer.num_frames_ready)])


def test_batches_decode_back_to_the_manifest(tiny_corpus):
    module = SpeechDataModule(config(tiny_corpus, targets=["phones", "chars", "sentencepiece"],
                                     sentencepiece_vocab=40))
    module.setup("fit")
    assert list(module.tokenizers) == ["phones", "chars", "sentencepiece"]
    assert module.feature_dim == 40 and module.feature_mean.shape == module.feature_std.shape == (40,)
    seen = 0
    for batch in module.val_dataloader():
        assert batch["features"].dtype == torch.float32 and batch["features"].shape[2] == 40
        assert batch["features"].shape[:2] == (len(batch["ids"]), batch["feature_lengths"].max())
        for kind, tokenizer in module.tokenizers.items():
            for i in range(len(batch["ids"])):
                length = batch["target_lengths"][kind][i]
                assert not batch["targets"][kind][i, length:].any()  # padded with the blank
                expected = batch["phones"][i] if kind == "phones" else batch["texts"][i]
                assert tokenizer.decode(batch["targets"][kind][i, :length].tolist()) == expected
        seen += len(batch["ids"])
    assert seen == 6


def test_global_statistics_equal_numpy_over_all_training_frames(tiny_corpus):
    module = SpeechDataModule(config(tiny_corpus, targets=["phones"]))
    module.setup("fit")
    frames = np.concatenate([kaldi_frames(tiny_corpus / "audio" / f"tr{i:04d}.flac") for i in range(24)])
    np.testing.assert_allclose(module.feature_mean.numpy(), frames.mean(axis=0), atol=1e-3)
    np.testing.assert_allclose(module.feature_std.numpy(), frames.std(axis=0), atol=1e-3)
    # the on-the-fly mode computes the same statistics without storing features
    on_the_fly = SpeechDataModule(config(tiny_corpus, targets=["phones"], precompute_features=False))
    on_the_fly.setup("fit")
    np.testing.assert_allclose(on_the_fly.feature_std.numpy(), frames.std(axis=0), atol=1e-3)


def test_batches_respect_max_duration_and_cover_every_utterance_once_per_epoch(tmp_path):
    root = write_corpus(tmp_path / "c", {"train": make_utterances(60, 4, "tr", 0.5, 3.0),
                                         "dev": make_utterances(3, 5, "dv")})
    module = SpeechDataModule(config(root, targets=["phones"], max_duration=7.0, num_buckets=4), seed=3)
    module.setup("fit")
    durations = {cut.id: cut.duration for cut in module.split("train").cuts}
    loader = module.train_dataloader()
    orders = []
    for epoch in range(2):
        loader.sampler.set_epoch(epoch)
        ids = []
        for batch in loader:
            batch_durations = [durations[i] for i in batch["ids"]]
            assert len(batch_durations) * max(batch_durations) <= 7.0  # padded, hence also the sum
            ids.extend(batch["ids"])
        assert sorted(ids) == sorted(durations)  # each utterance exactly once
        orders.append(ids)
    assert orders[0] != orders[1]  # reshuffled per epoch
    again = SpeechDataModule(config(root, targets=["phones"], max_duration=7.0, num_buckets=4), seed=3)
    again.setup("fit")
    loader = again.train_dataloader()
    loader.sampler.set_epoch(1)
    assert [i for batch in loader for i in batch["ids"]] == orders[1]  # same seed and epoch, same batches


def test_utterances_with_more_ctc_targets_than_encoder_frames(tmp_path):
    """Hand computation: samples n -> frames 1 + (n - 400) // 160 -> encoder frames // 4; CTC needs one
    frame per phone plus one per pair of equal neighbours."""
    n = 8000  # 0.5 s: 48 frames, 12 encoder frames
    phones = list(ARPABET_39)
    cases = {
        "fits12": " ".join(phones[:12]),                      # 12 needed: kept
        "over13": " ".join(phones[:13]),                      # 13 needed: dropped
        "repeat": " ".join(phones[:5] + ["AA"] + phones[5:11]),  # AA twice, not adjacent: 12 needed: kept
        "twins": " ".join(["AA", "AA"] + phones[1:11]),      # 12 phones + 1 repeat = 13: dropped
        "twins_short": " ".join(["AA", "AA"] + phones[1:10]),  # 11 + 1 = 12: kept
    }
    expected_dropped = {"over13", "twins"}
    rng = np.random.default_rng(0)
    train = [{"id": cut_id, "duration": n / 16000, "text": "a", "phones": p,
              "audio": (0.1 * rng.standard_normal(n)).astype(np.float32)} for cut_id, p in cases.items()]
    dev = [dict(u, id="dev_" + u["id"]) for u in train]
    root = write_corpus(tmp_path / "c", {"train": train, "dev": dev})
    module = SpeechDataModule(config(root, targets=["phones"]), frame_subsampling=4)
    module.setup("fit")
    kept = {cut.id for cut in module.split("train").cuts}
    assert kept == set(cases) - expected_dropped
    report = module.report()
    assert report["train"]["dropped"] == {"too_many_targets": 2}
    assert report["dev"]["utterances"] == 5 and report["dev"]["ctc_infeasible_kept"] == 2


def test_missing_audio_fails_early_naming_file_and_cut_or_is_skipped(tiny_corpus):
    missing = tiny_corpus / "audio" / "tr0007.flac"
    os.remove(missing)
    with pytest.raises(ManifestError, match="tr0007") as info:
        SpeechDataModule(config(tiny_corpus, targets=["phones"])).setup("fit")
    assert str(missing) in str(info.value) and "skip_bad_audio" in str(info.value)
    assert not (tiny_corpus / "features").exists() or not any((tiny_corpus / "features").rglob("*.lilcom"))
    module = SpeechDataModule(config(tiny_corpus, targets=["phones"], skip_bad_audio=True))
    module.setup("fit")
    assert module.report()["train"]["dropped"] == {"bad_audio": 1}
    assert "tr0007" not in {cut.id for cut in module.split("train").cuts}


def test_audio_corrupt_past_its_header_is_reported_and_finished_work_is_kept(tiny_corpus, monkeypatch):
    monkeypatch.setattr(feature_cache, "SHARD_CUTS", 8)  # 3 shards of training features
    path = tiny_corpus / "audio" / "tr0020.flac"
    good = path.read_bytes()
    path.write_bytes(good[:len(good) // 2] + b"\x00" * (len(good) - len(good) // 2))  # header intact
    with pytest.raises(ManifestError, match="tr0020") as info:
        SpeechDataModule(config(tiny_corpus, targets=["phones"])).setup("fit")
    assert str(path) in str(info.value)
    computed = []
    original = feature_cache._compute_chunk
    monkeypatch.setattr(feature_cache, "_compute_chunk",
                        lambda cuts, *a: computed.extend(c.id for c in cuts) or original(cuts, *a))
    path.write_bytes(good)
    SpeechDataModule(config(tiny_corpus, targets=["phones"])).setup("fit")
    assert computed == ["tr0020"] + [f"dv{i:04d}" for i in range(6)]  # train's other 23 were kept on disk


def test_features_are_cached_and_recomputed_when_options_or_audio_change(tiny_corpus, monkeypatch):
    computed = []
    original = feature_cache._compute_chunk
    monkeypatch.setattr(feature_cache, "_compute_chunk",
                        lambda cuts, *a: computed.extend(c.id for c in cuts) or original(cuts, *a))
    SpeechDataModule(config(tiny_corpus, targets=["phones"])).setup("fit")
    assert len(computed) == 30
    computed.clear()
    SpeechDataModule(config(tiny_corpus, targets=["phones"])).setup("fit")
    assert computed == []
    SpeechDataModule(config(tiny_corpus, targets=["phones"], num_mel_bins=80)).setup("fit")
    assert len(computed) == 30 and len([p for p in (tiny_corpus / "features").iterdir() if p.is_dir()]) == 2
    computed.clear()
    audio, rate = soundfile.read(tiny_corpus / "audio" / "dv0002.flac")
    soundfile.write(tiny_corpus / "audio" / "dv0002.flac", audio * 0.5, rate, subtype="PCM_16")
    module = SpeechDataModule(config(tiny_corpus, targets=["phones"]))
    module.setup("fit")
    assert computed == ["dv0002"]
    np.testing.assert_allclose(module.split("dev").features.store.load("dv0002"),
                               kaldi_frames(tiny_corpus / "audio" / "dv0002.flac"), atol=2e-3)


def test_on_the_fly_and_precomputed_batches_agree(tiny_corpus):
    batches = {}
    for precompute in (True, False):
        module = SpeechDataModule(config(tiny_corpus, targets=["chars"], precompute_features=precompute))
        module.setup("validate")
        batches[precompute] = list(module.val_dataloader())
    # the cache stores frames to 1/512 of a log-mel unit (lilcom); normalised, that is 1/512 / std
    tolerance = feature_cache.LILCOM_HALF_TICK / float(module.feature_std.min()) + 1e-5
    for a, b in zip(batches[True], batches[False]):
        assert a["ids"] == b["ids"] and torch.equal(a["targets"]["chars"], b["targets"]["chars"])
        torch.testing.assert_close(a["features"], b["features"], atol=tolerance, rtol=0)
        assert not torch.equal(a["features"], b["features"])     # the cache does quantise


def test_cached_frames_are_lilcom_blobs_within_half_a_tick_of_the_filterbank(tiny_corpus):
    module = SpeechDataModule(config(tiny_corpus, targets=["phones"]))
    module.setup("validate")
    store = module.split("dev").features.store
    filterbank = FilterBank(num_mel_bins=40)
    float32_bytes = 0
    for cut in module.split("dev").cuts:
        exact = filterbank(feature_cache.load_waveform(cut)).numpy()
        stored = store.load(cut.id)
        assert stored.dtype == np.float32 and stored.shape == exact.shape
        assert np.abs(stored - exact).max() <= feature_cache.LILCOM_HALF_TICK * (1 + 1e-4)
        float32_bytes += exact.nbytes
    shards = list(store.directory.glob("shard-*.lilcom"))
    assert shards and sum(shard.stat().st_size for shard in shards) < 0.6 * float32_bytes


def test_a_cache_of_the_old_float32_format_is_recomputed_and_deleted(tiny_corpus, monkeypatch):
    module = SpeechDataModule(config(tiny_corpus, targets=["phones"]))
    module.setup("validate")
    split_folder = module.split("dev").features.store.directory
    module.split("dev").features.store.close()   # a reader of the split keeps superseded shards from deletion
    for path in split_folder.glob("shard-*"):
        path.unlink()
    old = split_folder / "shard-00000000000000000001-0ld0ld00"
    np.save(old.with_suffix(".npy"), np.zeros((10, 40), np.float32))
    old.with_suffix(".json").write_text('{"dv0000": [0, 10, "fingerprint"]}')
    computed = []
    original = feature_cache._compute_chunk
    monkeypatch.setattr(feature_cache, "_compute_chunk",
                        lambda cuts, *a: computed.extend(c.id for c in cuts) or original(cuts, *a))
    SpeechDataModule(config(tiny_corpus, targets=["phones"])).setup("validate")
    assert computed == [f"dv{i:04d}" for i in range(6)]
    assert not list(split_folder.glob("shard-*.npy")) and not old.with_suffix(".json").exists()


def test_empty_transcripts_are_skipped_and_counted(tmp_path):
    train = make_utterances(6, 7, "tr")
    train[2]["text"] = "  "
    train[4]["phones"] = ""
    root = write_corpus(tmp_path / "c", {"train": train, "dev": make_utterances(2, 8, "dv")})
    module = SpeechDataModule(config(root))
    module.setup("fit")
    assert module.report()["train"]["dropped"] == {"empty_transcript": 2}
    assert {c.id for c in module.split("train").cuts} == {"tr0000", "tr0001", "tr0003", "tr0005"}


def test_phone_outside_the_inventory_names_phone_and_cut(tmp_path):
    dev = make_utterances(3, 8, "dv")
    dev[1]["phones"] = "AA QQ B"
    root = write_corpus(tmp_path / "c", {"train": make_utterances(4, 7, "tr"), "dev": dev})
    with pytest.raises(ManifestError, match=r"phones 'QQ' in 1 utterances, e.g. dv0001"):
        SpeechDataModule(config(root)).setup("fit")


def test_phone_set_named_by_the_manifest(tmp_path):
    def timit(utterances):
        return [dict(u, phones="H# " + u["phones"].replace("ZH", "AX-H"), phone_set="timit61") for u in utterances]

    root = write_corpus(tmp_path / "c", {"train": timit(make_utterances(4, 7, "tr")),
                                         "dev": timit(make_utterances(2, 8, "dv")), "test": make_utterances(2, 9, "te")})
    module = SpeechDataModule(config(root, targets=["phones"]))
    module.setup("fit")
    assert module.tokenizers["phones"].phone_set == "timit61" and module.tokenizers["phones"].vocab_size == 62
    batch = next(iter(module.val_dataloader()))
    assert module.tokenizers["phones"].decode(batch["targets"]["phones"][0].tolist()) == batch["phones"][0]
    with pytest.raises(ManifestError, match="test: the manifest's phones are 'arpabet39'.*'timit61'"):
        module.setup("test")


def test_missing_manifest_says_how_to_make_it(tmp_path):
    with pytest.raises(ManifestError, match=r"synth_cuts_train.jsonl.gz not found.*recipes.synth.prepare"):
        SpeechDataModule(config(tmp_path / "nothing", corpus="synth")).setup("fit")


def test_relative_audio_paths_are_relative_to_root(tmp_path, monkeypatch):
    root = write_corpus(tmp_path / "c", {"train": make_utterances(4, 7, "tr"), "dev": make_utterances(2, 8, "dv")},
                        relative_paths=True)
    monkeypatch.chdir(tmp_path)  # not the root
    module = SpeechDataModule(config(root, targets=["phones"]))
    module.setup("fit")
    assert sum(len(b["ids"]) for b in module.train_dataloader()) == 4


def test_tokenizers_from_a_checkpoint_are_used_as_given(tiny_corpus):
    trained = SpeechDataModule(config(tiny_corpus, targets=["sentencepiece", "phones"], sentencepiece_vocab=40))
    trained.setup("fit")
    states = {kind: t.state_dict() for kind, t in trained.tokenizers.items()}
    evaluating = SpeechDataModule(config(tiny_corpus, targets=["sentencepiece", "phones"]))  # vocab differs
    evaluating.set_tokenizers(states)
    evaluating.setup("test")
    assert evaluating.tokenizers["sentencepiece"].vocab_size == 41
    batch = next(iter(evaluating.test_dataloader()))
    assert batch["targets"]["sentencepiece"][0, :batch["target_lengths"]["sentencepiece"][0]].tolist() == \
        trained.tokenizers["sentencepiece"].encode(batch["texts"][0])
    with pytest.raises(ValueError, match="no tokenizer for targets"):
        SpeechDataModule(config(tiny_corpus, targets=["chars"])).set_tokenizers(states)


def test_config_errors_name_the_option():
    # a DataConfig checks its values when it is made; the data module takes only one
    with pytest.raises(ValueError, match="num_mel_bins=64"):
        DataConfig(num_mel_bins=64)
    with pytest.raises(ValueError, match="unknown tokenizer kind 'words'"):
        DataConfig(targets=["words"])
    with pytest.raises(TypeError, match="SpeechDataModule takes a DataConfig"):
        SpeechDataModule({"num_mel_bins": 40})
    with pytest.raises(ValueError, match=r"unknown data options \['max_durration'\]"):
        DataConfig.of({"max_durration": 10})
    from omegaconf import OmegaConf

    cfg = DataConfig.of(OmegaConf.structured(DataConfig(num_mel_bins=80)))
    assert cfg.num_mel_bins == 80 and cfg.targets == ["phones", "chars"]


def test_max_duration_shorter_than_an_utterance(tiny_corpus):
    with pytest.raises(ManifestError, match=r"longer than data.max_duration=1 s \(no batch can hold it; "
                                            r"data.max_duration=.* would keep it\)"):
        SpeechDataModule(config(tiny_corpus, targets=["phones"], max_duration=1.0)).setup("fit")


def test_a_lightning_run_resumed_from_a_checkpoint_sees_the_same_batches(tiny_corpus, tmp_path):
    import lightning

    class Recorder(lightning.LightningModule):
        def __init__(self, seen):
            super().__init__()
            self.weight = torch.nn.Linear(40, 1)
            self.seen = seen

        def training_step(self, batch, index):
            self.seen.append((self.current_epoch, batch["ids"], float(batch["features"].sum())))
            return self.weight(batch["features"]).mean()

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), 0.1)

    def fit(epochs, folder, resume=None):
        seen = []
        # the checkpoint is written by ModelCheckpoint at the end of an epoch, as in asr.train
        checkpoint = lightning.pytorch.callbacks.ModelCheckpoint(dirpath=folder, save_last=True)
        trainer = lightning.Trainer(max_epochs=epochs, use_distributed_sampler=False, logger=False,
                                    callbacks=[checkpoint], enable_progress_bar=False,
                                    enable_model_summary=False, limit_val_batches=0)
        trainer.fit(Recorder(seen), datamodule=SpeechDataModule(config(tiny_corpus, targets=["phones"],
                                                                      max_duration=5.0), seed=2),
                    ckpt_path=resume)
        return seen

    whole = fit(2, tmp_path / "whole")
    fit(1, tmp_path / "interrupted")
    resumed = fit(2, tmp_path / "interrupted", resume=tmp_path / "interrupted" / "last.ckpt")
    assert resumed == [entry for entry in whole if entry[0] == 1]  # same cuts, same SpecAugment masks
    assert [e[1] for e in whole if e[0] == 0] != [e[1] for e in resumed]


def test_a_read_only_corpus_folder_needs_a_writable_cache_dir(tmp_path, monkeypatch):
    """Tests run as root, for whom chmod does not stop writes; the corpus folder is read-only here
    in the way the check sees it (os.access says no write for it and everything under it), and the
    test asserts that nothing is written into it."""
    import shutil

    from asr.data import config as data_config
    corpus = tmp_path / "corpus"
    write_corpus(corpus, {"train": make_utterances(8, 1, "tr"), "dev": make_utterances(3, 2, "dv"),
                          "test": make_utterances(3, 3, "te")})
    before = sorted(path.relative_to(corpus) for path in corpus.rglob("*"))
    real_access = os.access
    monkeypatch.setattr(data_config.os, "access", lambda path, mode, *a, **k: (
        False if mode & os.W_OK and str(path).startswith(str(corpus)) else real_access(path, mode, *a, **k)))

    with pytest.raises(ValueError, match=r"cannot be written \(data.root=.* is read-only\): give a writable "
                                         r"folder with data.cache_dir=FOLDER"):
        DataConfig.of(config(corpus, targets=["phones"]))
    with pytest.raises(ValueError, match=r"data.cache_dir=.* is not writable"):
        DataConfig.of(config(corpus, targets=["phones"], cache_dir=str(corpus / "cache")))

    cache = tmp_path / "cache"
    module = SpeechDataModule(config(corpus, targets=["phones"], cache_dir=str(cache)))
    module.setup("fit")
    assert next(iter(module.train_dataloader()))["features"].shape[2] == 40
    assert sorted(path.relative_to(corpus) for path in corpus.rglob("*")) == before   # nothing written there
    assert list(cache.glob("*/train/shard-*.lilcom")) and list(cache.glob("*/dev/shard-*.lilcom"))
    assert list(cache.glob("*/train/stats-*.json"))
    shutil.rmtree(cache)
    # and per-batch features need no cache at all
    SpeechDataModule(config(corpus, targets=["phones"], precompute_features=False)).setup("fit")


def test_data_benchmark_exits_2_with_one_line_for_a_folder_without_manifests(tmp_path, capsys):
    from asr.benchmarks import data as benchmark
    assert benchmark.main(["--root", str(tmp_path / "nothing")]) == 2
    error = capsys.readouterr().err.strip().splitlines()
    assert len(error) == 1 and error[0].startswith("asr.benchmarks.data: error: manifest ")
    write_corpus(tmp_path / "c", {"train": make_utterances(2, 1, "tr")}, "synth")
    assert benchmark.main(["--root", str(tmp_path / "c"), "--max-duration", "-1"]) == 2
    assert "data.max_duration=-1.0 must be a positive" in capsys.readouterr().err

"""data.join_seconds: long training examples of consecutive utterances joined with a pause
(asr/data/batching/joined_examples.py), checked against the utterances' own cached features and token ids."""
from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch
from synthetic_corpus import make_utterances, write_corpus

from asr.data.config import DataConfig

from asr.data.datamodule import SpeechDataModule
from asr.data.batching.joined_examples import join_utterances, pause_between
from asr.data.features.features import FilterBank
from asr.data.corpus.manifests import load_cuts, transcript

JOIN_SECONDS = 6.0
PAUSE = 0.3


def config(root, **options) -> DataConfig:
    settings = dict(corpus="tiny", root=str(root), progress=False, max_duration=12.0, num_buckets=2,
                    specaugment=False, join_seconds=JOIN_SECONDS, join_pause=PAUSE)
    settings.update(options)
    return DataConfig(**settings)


def module(root, seed=0, **options) -> SpeechDataModule:
    data = SpeechDataModule(config(root, **options), frame_subsampling=1, seed=seed)
    data.setup("fit")
    return data


def epoch_batches(data: SpeechDataModule, epoch: int) -> list:
    loader = data.train_dataloader()
    loader.sampler.set_epoch(epoch)
    return list(loader)


def digital_silence_frame(bins: int) -> torch.Tensor:
    """Kaldi's fbank of zero samples: its log energy floor, log(FLT_EPSILON), in every bin."""
    return torch.full((bins,), math.log(np.finfo(np.float32).eps), dtype=torch.float32)


@pytest.fixture
def two_speaker_corpus(tmp_path):
    """24 training utterances of 0.6-2.5 s whose speakers alternate a, b, a, b, ... in the manifest."""
    train = make_utterances(24, 1, "tr")
    for i, utterance in enumerate(train):
        utterance["speaker"] = "a" if i % 2 == 0 else "b"
    root = tmp_path / "tiny"
    write_corpus(root, {"train": train, "dev": make_utterances(6, 2, "dv"), "test": make_utterances(6, 3, "te")})
    return root


def test_joined_features_are_the_utterances_features_with_silence_between(tiny_corpus):
    data = module(tiny_corpus)
    train = data.split("train")
    by_id = {cut.id: cut for cut in train.cuts}
    silence = digital_silence_frame(data.feature_dim)
    pause_frames = round(PAUSE * 100)
    joined = 0
    for batch in epoch_batches(data, 0):
        for row, example_id in enumerate(batch["ids"]):
            members = [by_id[i] for i in example_id.split("+")]
            pieces = []
            for k, member in enumerate(members):
                if k:
                    pieces.append(silence.expand(pause_frames, -1))
                pieces.append(torch.from_numpy(train.features.store.load(member.id)))
            expected = torch.cat(pieces)
            length = int(batch["feature_lengths"][row])
            assert length == len(expected)
            assert torch.equal(batch["features"][row, :length], expected)   # bit-exact
            assert not batch["features"][row, length:].any()
            joined += len(members) > 1
    assert joined >= 3


def test_targets_are_the_utterances_ids_concatenated(tiny_corpus):
    data = module(tiny_corpus, targets=["phones", "chars", "sentencepiece"], sentencepiece_vocab=40)
    by_id = {cut.id: cut for cut in data.split("train").cuts}
    phones, chars, pieces = (data.tokenizers[kind] for kind in ("phones", "chars", "sentencepiece"))
    space = chars.encode(" ")
    for batch in epoch_batches(data, 0):
        for row, example_id in enumerate(batch["ids"]):
            members = [by_id[i] for i in example_id.split("+")]
            expected = {"phones": sum((phones.encode(transcript(m, "phones")) for m in members), []),
                        "chars": [], "sentencepiece": sum((pieces.encode(transcript(m, "text")) for m in members), [])}
            for k, member in enumerate(members):
                expected["chars"] += (space if k else []) + chars.encode(transcript(member, "text"))
            for kind, ids in expected.items():
                length = int(batch["target_lengths"][kind][row])
                assert batch["targets"][kind][row, :length].tolist() == ids, kind
            assert batch["texts"][row] == " ".join(transcript(m, "text") for m in members)
            assert batch["phones"][row] == " ".join(transcript(m, "phones") for m in members)


def test_every_utterance_once_per_epoch_and_examples_within_join_seconds(tiny_corpus):
    data = module(tiny_corpus)
    train_ids = sorted(cut.id for cut in data.split("train").cuts)
    durations = {cut.id: cut.duration for cut in data.split("train").cuts}
    for epoch in (0, 1):
        seen = [member for batch in epoch_batches(data, epoch) for example in batch["ids"]
                for member in example.split("+")]
        assert sorted(seen) == train_ids
    examples = data._joined_examples(data.split("train").cuts, pause_between(data.filterbank, PAUSE))
    for example in examples:
        members = example.id.split("+")
        length = sum(durations[m] for m in members) + PAUSE * (len(members) - 1)
        assert example.duration == pytest.approx(length, abs=1e-6)
        assert length <= JOIN_SECONDS + 1e-9 or len(members) == 1
    # the examples are runs of consecutive utterances, in manifest order (one speaker here)
    assert [m for example in examples for m in example.id.split("+")] == [c.id for c in data.split("train").cuts]


def test_an_utterance_longer_than_join_seconds_stays_alone(tiny_corpus):
    cuts = load_cuts(tiny_corpus, "tiny", "train", need_phones=True)
    examples = join_utterances(cuts, 1.0, pause_between(FilterBank(40), PAUSE), "speaker", 0)
    for example in examples:
        assert example.duration <= 1.0 or "+" not in example.id


def test_grouping_is_deterministic_per_seed(tiny_corpus):
    cuts = load_cuts(tiny_corpus, "tiny", "train", need_phones=True)
    pause = pause_between(FilterBank(40), PAUSE)
    ids = lambda seed: [example.id for example in join_utterances(cuts, JOIN_SECONDS, pause, "speaker", seed)]
    assert ids(0) == ids(0)
    assert any(ids(seed) != ids(0) for seed in (1, 2, 3))   # the lengths are drawn from the seed
    first, again = module(tiny_corpus, seed=5), module(tiny_corpus, seed=5)
    for a, b in zip(epoch_batches(first, 1), epoch_batches(again, 1), strict=True):
        assert a["ids"] == b["ids"] and torch.equal(a["features"], b["features"])


def test_one_speakers_utterances_join_in_their_manifest_order(two_speaker_corpus):
    cuts = load_cuts(two_speaker_corpus, "tiny", "train", need_phones=True)
    speaker = {cut.id: cut.supervisions[0].speaker for cut in cuts}
    pause = pause_between(FilterBank(40), PAUSE)
    by_speaker = join_utterances(cuts, JOIN_SECONDS, pause, "speaker", 0)
    for example in by_speaker:
        assert len({speaker[m] for m in example.id.split("+")}) == 1
    for who in ("a", "b"):
        order = [m for example in by_speaker for m in example.id.split("+") if speaker[m] == who]
        assert order == [cut.id for cut in cuts if speaker[cut.id] == who]
    consecutive = join_utterances(cuts, JOIN_SECONDS, pause, "none", 0)
    assert [m for example in consecutive for m in example.id.split("+")] == [cut.id for cut in cuts]
    assert any(len({speaker[m] for m in example.id.split("+")}) == 2 for example in consecutive)


def test_speed_copies_join_copies_of_their_own_factor(tiny_corpus):
    from asr.data.augment.waveform_augmentation import with_speed_copies

    cuts = with_speed_copies(load_cuts(tiny_corpus, "tiny", "train", need_phones=True), [0.9, 1.1])
    factor = lambda cut_id: cut_id.rsplit("_sp", 1)[1] if "_sp" in cut_id else "1.0"
    examples = join_utterances(cuts, JOIN_SECONDS, pause_between(FilterBank(40), PAUSE), "speaker", 0)
    assert sorted(m for example in examples for m in example.id.split("+")) == sorted(cut.id for cut in cuts)
    for example in examples:
        assert len({factor(m) for m in example.id.split("+")}) == 1


def test_dev_and_test_stay_per_utterance(tiny_corpus):
    joined, plain = module(tiny_corpus), module(tiny_corpus, join_seconds=None)
    for loader in ("val_dataloader", "test_dataloader"):
        batches, reference = list(getattr(joined, loader)()), list(getattr(plain, loader)())
        assert len(batches) == len(reference)
        for a, b in zip(batches, reference):
            assert a["ids"] == b["ids"] and "+" not in "".join(a["ids"])
            assert torch.equal(a["features"], b["features"])
            assert all(torch.equal(a["targets"][k], b["targets"][k]) for k in a["targets"])


def test_augmentations_apply_per_utterance_and_leave_the_pause_alone(tiny_corpus):
    data = module(tiny_corpus, specaugment=True, time_masks=3, time_mask_width=20, freq_masks=2)
    train = data.split("train")
    fill = data.feature_mean
    pause_frames = round(PAUSE * 100)
    silence = digital_silence_frame(data.feature_dim)
    masked = 0
    for batch in epoch_batches(data, 0):
        for row, example_id in enumerate(batch["ids"]):
            start = 0
            for k, member in enumerate(example_id.split("+")):
                if k:
                    gap = batch["features"][row, start:start + pause_frames]
                    assert torch.equal(gap, silence.expand(pause_frames, -1))
                    start += pause_frames
                clean = torch.from_numpy(train.features.store.load(member))
                span = batch["features"][row, start:start + len(clean)]
                changed = span != clean
                # every changed value is its bin's fill (the global mean): a mask inside this utterance
                assert torch.equal(span[changed], fill.expand_as(span)[changed])
                masked += int(changed.any())
                start += len(clean)
            assert start == int(batch["feature_lengths"][row])
    assert masked > 0


@pytest.mark.parametrize("options, message", [
    ({"join_seconds": 0.0}, "data.join_seconds=0.0 must be a positive"),
    ({"join_seconds": -5.0}, "data.join_seconds=-5.0 must be a positive"),
    ({"join_seconds": 30.0}, "data.join_seconds=30.0 is longer than data.max_duration=12.0"),
    ({"join_pause": -0.1}, "data.join_pause=-0.1 must be"),
    ({"join_by": "recording"}, "data.join_by='recording'; choose one of speaker, none"),
])
def test_bad_join_options_are_refused_by_name(tiny_corpus, options, message):
    with pytest.raises(ValueError, match=message):
        config(tiny_corpus, **options)   # a DataConfig checks its values when it is made


def test_streaming_refuses_joined_examples(tiny_corpus):
    data = SpeechDataModule(config(tiny_corpus, streaming=True), frame_subsampling=1)
    with pytest.raises(ValueError, match=r"data.streaming=true.*data.join_seconds=6.0"):
        data.setup("fit")
    auto = SpeechDataModule(config(tiny_corpus, streaming="auto"), frame_subsampling=1)
    assert auto.streaming is False


def test_fixed_batch_shapes_hold_joined_examples(tiny_corpus):
    data = module(tiny_corpus, fixed_batch_shapes=True)
    sampler = data.train_dataloader().sampler
    shapes = set(sampler.fixed_shapes.shapes)
    for batch in epoch_batches(data, 0):   # a joined example never outgrows its bucket's frames
        assert tuple(batch["features"].shape[:2]) in shapes


def test_a_tiny_model_trains_on_joined_examples(tiny_synth, tmp_path):
    from asr.evaluation.evaluation import load_model
    from asr.evaluation.evaluation_data import EvaluationError, evaluation_data
    from asr.training.fit import train
    from tiny_runs import tiny_config

    cfg = tiny_config(tiny_synth, "conf=synth_full", "data.join_seconds=20", "data.join_by=none", "test=false",
                      "trainer.max_steps=3", "trainer.record_batches=true")
    results = train(cfg, tmp_path / "run")
    assert results["steps"] >= 1
    records = [json.loads(line) for line in (tmp_path / "run" / "batches" / "rank0.jsonl").read_text().splitlines()]
    examples = [example for record in records if not record["padding"] for example in record["ids"]]
    assert any("+" in example for example in examples)
    members = [member for example in examples for member in example.split("+")]
    assert len(members) == len(set(members))   # no utterance twice in the epoch trained
    # scoring the run reads every utterance alone, whatever batch size it asks for; the keys are refused there
    checkpoint = str(tmp_path / "run" / "checkpoints" / "best.ckpt")
    model = load_model(checkpoint)
    scored = evaluation_data(model, checkpoint, "dev", data_overrides={"max_duration": 15}, progress=False)
    assert scored.datamodule.cfg.join_seconds is None
    assert all("+" not in i for batch in scored.datamodule.val_dataloader() for i in batch["ids"])
    with pytest.raises(EvaluationError, match="data.join_seconds shapes the training set only"):
        evaluation_data(model, checkpoint, data_overrides={"join_seconds": 10.0}, progress=False)

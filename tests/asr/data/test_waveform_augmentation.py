"""data.augment: each transform's effect measured on the audio, determinism, the training set's speed
copies, and bad values. The references are computed here (numpy), not taken from the code under test."""
import math
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from lhotse import MonoCut, Recording
from synthetic_corpus import make_utterances, write_corpus

from asr.data.augment import waveform_augmentation as wa
from asr.data.config import DataConfig
from asr.data.datamodule import SpeechDataModule
from asr.data.features.features import FilterBank
from asr.data.splits.tokenizers import encode_transcripts
from asr.data.augment.waveform_augmentation import AugmentConfig, WaveformAugmenter, validate_augment_config

ROOT = Path(__file__).resolve().parents[3]


def config(root, **overrides):
    options = dict(corpus="tiny", root=str(root), max_duration=8.0, progress=False, feature_jobs=1,
                   targets=["phones"])
    options.update(overrides)
    return DataConfig(**options)


def cuts_of(root):
    from lhotse import CutSet
    return list(CutSet.from_file(root / "tiny_cuts_train.jsonl.gz"))


def augmenter(tiny_corpus, seed=0, **options):
    return WaveformAugmenter(AugmentConfig(**options), seed, FilterBank(40), cuts_of(tiny_corpus))


def energy(samples):
    return float(np.sum(np.asarray(samples, dtype=np.float64) ** 2))


def test_speed_perturbation_changes_the_length_by_the_factor_and_adds_copies(tiny_corpus):
    cut = cuts_of(tiny_corpus)[0]
    for factor in (0.9, 1.1):
        audio = cut.perturb_speed(factor).load_audio()[0]
        assert abs(len(audio) - cut.num_samples / factor) <= 1
    module = SpeechDataModule(config(tiny_corpus, augment=AugmentConfig(speed=[0.9, 1.0, 1.1])))
    module.setup("fit")
    train = module.split("train")
    ids = [c.id for c in train.cuts]
    assert len(ids) == 3 * 24 and sum(i.endswith("_sp0.9") for i in ids) == 24 and sum(i.endswith("_sp1.1") for i in ids) == 24
    by_id = {c.id: c for c in train.cuts}
    filterbank = FilterBank(40)
    for cut_id in ("tr0000", "tr0000_sp0.9", "tr0000_sp1.1"):   # cached features of the perturbed audio
        expected = filterbank(by_id[cut_id].load_audio()[0])
        assert train.features.load(by_id[cut_id]).shape == expected.shape
        assert torch.allclose(train.features.load(by_id[cut_id]), expected, atol=2e-3)
    copy, original = encode_transcripts(by_id["tr0000_sp0.9"], module.tokenizers), \
        encode_transcripts(by_id["tr0000"], module.tokenizers)
    assert copy == original and all(copy.values())   # same transcript, same targets
    assert len(module.split("dev").cuts) == 6                       # dev and test are never perturbed


def test_volume_scales_the_samples_by_the_drawn_gain(tiny_corpus):
    cut = cuts_of(tiny_corpus)[0]
    out = augmenter(tiny_corpus, volume_prob=1.0, volume_range=[0.25, 0.25]).augmented(cut, 0).load_audio()[0]
    np.testing.assert_allclose(out, 0.25 * cut.load_audio()[0], rtol=1e-5, atol=1e-7)
    level = augmenter(tiny_corpus, volume_prob=1.0, volume_range=[0.5, 2.0])
    gains = [math.sqrt(energy(level.augmented(cut, e).load_audio()) / energy(cut.load_audio())) for e in range(20)]
    assert all(0.5 - 1e-4 <= g <= 2.0 + 1e-4 for g in gains) and max(gains) / min(gains) > 1.5


def test_simulated_rooms_follow_the_statistical_model():
    for seed in range(10):
        response = wa.simulated_room_response(np.random.default_rng(seed))
        onset = int(0.0025 * 16000)
        assert response[0] == 1.0 and not response[1:onset].any()
        tail = response[onset:]
        drr = 10 * math.log10(1.0 / energy(tail))
        assert 0.0 - 1e-9 <= drr <= 12.0 + 1e-9
        assert 0.2 * 16000 <= len(response) <= 0.8 * 16000
        tenth = len(tail) // 10
        assert energy(tail[-tenth:]) < 1e-3 * energy(tail[:tenth])    # decayed by tens of dB


def test_reverb_is_the_convolution_with_the_room_response(tiny_corpus, monkeypatch):
    rooms = []
    real = wa.simulated_room_response
    monkeypatch.setattr(wa, "simulated_room_response", lambda rng: rooms.append(real(rng)) or rooms[-1])
    cut = cuts_of(tiny_corpus)[1]
    out = augmenter(tiny_corpus, reverb_prob=1.0).augmented(cut, 0).load_audio()[0]
    clean = cut.load_audio()[0].astype(np.float64)
    expected = np.convolve(clean, rooms[0].astype(np.float32))[:len(clean)]
    # lhotse normalises the output to the input's peak level: compare shapes, then energies
    scale = np.dot(out, expected) / np.dot(expected, expected)
    np.testing.assert_allclose(out, scale * expected, atol=2e-3 * np.abs(out).max())
    assert len(out) == len(clean) and np.corrcoef(out, clean)[0, 1] < 0.999


def test_generated_noise_is_mixed_at_the_drawn_snr(tiny_corpus, monkeypatch):
    cut = cuts_of(tiny_corpus)[2]
    clean = cut.load_audio()[0].astype(np.float64)
    for colour in ("white", "pink", "brown"):
        monkeypatch.setattr(wa, "GENERATED_NOISES", (colour,))
        out = augmenter(tiny_corpus, noise_prob=1.0, noise_snr=[12.0, 12.0]).augmented(cut, 0).load_audio()[0]
        noise = out - clean
        assert 10 * math.log10(energy(clean) / energy(noise)) == pytest.approx(12.0, abs=0.05), colour
    monkeypatch.setattr(wa, "GENERATED_NOISES", ("babble",))
    out = augmenter(tiny_corpus, noise_prob=1.0, noise_snr=[12.0, 12.0]).augmented(cut, 0).load_audio()[0]
    babble_snr = 10 * math.log10(energy(clean) / energy(out - clean))
    assert 12.0 - 2.0 < babble_snr < 40.0   # three talkers at 12 + 4.8 dB each, some shorter than the cut


def test_spectral_coloured_noise_has_its_slope():
    rng = np.random.default_rng(0)
    for colour, slope in (("white", 0.0), ("pink", -1.0), ("brown", -2.0)):
        noise = wa.coloured_noise(colour, 1 << 16, rng)
        assert np.std(noise) == pytest.approx(1.0)
        power = np.abs(np.fft.rfft(noise)) ** 2
        frequencies = np.fft.rfftfreq(len(noise))
        band = (frequencies > 0.001) & (frequencies < 0.4)
        fitted = np.polyfit(np.log(frequencies[band]), np.log(power[band]), 1)[0]
        assert fitted == pytest.approx(slope, abs=0.1), colour


def test_telephone_and_band_limit_remove_the_high_band_and_every_channel_keeps_the_length(tiny_corpus, monkeypatch):
    cut = cuts_of(tiny_corpus)[3]
    noisy = cut.mix(MonoCut("n", 0.0, cut.duration, 0, recording=wa.in_memory_recording(
        0.05 * wa.coloured_noise("white", cut.num_samples, np.random.default_rng(1)), "n")), snr=0)

    def high_band_share(samples, above_hz):
        power = np.abs(np.fft.rfft(samples)) ** 2
        frequencies = np.fft.rfftfreq(len(samples), 1 / 16000)
        return power[frequencies > above_hz].sum() / power.sum()

    before = {hz: high_band_share(noisy.load_audio()[0], hz) for hz in (4200, 7500)}
    assert before[4200] > 0.1 and before[7500] > 0.01
    for kind, above_hz in (("telephone", 4200), ("band_limit", 7500), ("codec", None)):
        monkeypatch.setattr(wa, "CHANNELS", (kind,))
        for epoch in range(3):
            out = WaveformAugmenter._channel(noisy, wa.utterance_stream(0, epoch, "x"))
            samples = out.load_audio()[0]
            assert out.sampling_rate == 16000 and abs(len(samples) - noisy.num_samples) <= 1, kind
            if above_hz is not None:
                assert high_band_share(samples, above_hz) < 0.01 * before[above_hz], kind


def test_draws_are_fixed_by_seed_epoch_and_utterance_and_change_with_each(tiny_corpus):
    options = dict(reverb_prob=0.5, noise_prob=0.5, channel_prob=0.5, volume_prob=0.5)
    cuts = cuts_of(tiny_corpus)[:6]
    stored = type("Plain", (), {"load": staticmethod(lambda cut: FilterBank(40)(cut.load_audio()[0]))})()
    first, again = augmenter(tiny_corpus, **options), augmenter(tiny_corpus, **options)
    a = [first.features(c, 3, stored) for c in cuts]
    b = [again.features(c, 3, stored) for c in reversed(cuts)][::-1]        # another order, another object
    assert all(torch.equal(x, y) for x, y in zip(a, b))
    other_epoch = [first.features(c, 4, stored) for c in cuts]
    other_seed = [augmenter(tiny_corpus, seed=1, **options).features(c, 3, stored) for c in cuts]
    assert any(not torch.equal(x, y) for x, y in zip(a, other_epoch))
    assert any(not torch.equal(x, y) for x, y in zip(a, other_seed))


def test_augmented_training_batches_are_repeatable_and_evaluation_batches_untouched(tiny_corpus):
    augment = AugmentConfig(reverb_prob=0.5, noise_prob=0.5, channel_prob=0.5, volume_prob=0.5)

    def batches(loader_of, **overrides):
        module = SpeechDataModule(config(tiny_corpus, specaugment=False, **overrides), seed=7)
        module.setup("fit")
        return [b["features"] for b in getattr(module, loader_of)()]

    plain, augmented = batches("train_dataloader"), batches("train_dataloader", augment=augment)
    assert [x.shape for x in plain] == [x.shape for x in augmented]
    assert any(not torch.equal(x, y) for x, y in zip(plain, augmented))
    assert all(torch.equal(x, y) for x, y in zip(augmented, batches("train_dataloader", augment=augment,
                                                                       num_workers=2)))
    assert all(torch.equal(x, y) for x, y in zip(batches("val_dataloader"),
                                                 batches("val_dataloader", augment=augment)))


@pytest.mark.parametrize("options, message", [
    ({"speed": [0.9, 1.1]}, "data.augment.speed=[0.9, 1.1] must include 1.0"),
    ({"speed": [1.0, 3.0]}, "data.augment.speed=[1.0, 3.0] must list distinct factors in [0.5, 2]"),
    ({"noise_prob": 1.5}, "data.augment.noise_prob=1.5 must be a probability in [0, 1]"),
    ({"noise_snr": [20.0, 10.0]}, "data.augment.noise_snr=[20.0, 10.0] must be [low, high] with low <= high"),
    ({"volume_range": [0.0, 2.0]}, "data.augment.volume_range=[0.0, 2.0] must be [low, high] with low <= high and low > 0"),
])
def test_bad_values_are_refused_naming_the_option(options, message):
    with pytest.raises(ValueError) as error:
        validate_augment_config(AugmentConfig(**options))
    assert message in str(error.value)


def test_a_missing_noise_source_is_refused_by_training_only():
    cfg = AugmentConfig(noise_source="/no/such/noise")
    validate_augment_config(cfg)    # an evaluation of a model trained with it does not need it
    with pytest.raises(ValueError, match="data.augment.noise_source='/no/such/noise' does not exist"):
        wa.check_augment_sources(cfg)


def test_unknown_augment_key_is_refused_listing_the_options():
    with pytest.raises(ValueError, match=r"unknown data.augment options \['reverb'\]; the options are: channel_prob"):
        DataConfig.of({"augment": {"reverb": 0.5}})


@pytest.mark.parametrize("override, message", [
    ("data.augment.reverb_prob=2", "data.augment.reverb_prob=2.0 must be a probability in [0, 1]"),
    ("data.augment.speed=[0.9,1.1]", "must include 1.0"),
    ("data.augment.rir_source=/no/rooms", "data.augment.rir_source='/no/rooms' does not exist"),
    ("data.augment.vtlp_warp_range=[0.8,2.5]",
     "data.augment.vtlp_warp_range=[0.8, 2.5] must be [low, high] with 0.5 <= low <= high <= 2.0"),
])
def test_asr_train_refuses_a_bad_value_in_one_line_with_exit_status_2(tmp_path, override, message):
    result = subprocess.run([sys.executable, "-m", "asr.train", override, f"run_root={tmp_path}"],
                            cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert result.returncode == 2, result.stderr
    errors = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(errors) == 1 and message in errors[0], result.stderr


def test_noise_and_rooms_from_a_folder_of_recordings(tiny_corpus, tmp_path):
    import soundfile
    folder = tmp_path / "noises"
    folder.mkdir()
    soundfile.write(folder / "hum.wav", 0.1 * np.sin(2 * np.pi * 120 * np.arange(48000) / 16000), 16000)
    room = np.zeros(800)
    room[0], room[400] = 1.0, 0.5            # an echo 25 ms later, half as loud
    rooms = tmp_path / "rooms"
    rooms.mkdir()
    soundfile.write(rooms / "room.wav", room, 16000, subtype="FLOAT")
    cut = cuts_of(tiny_corpus)[4]
    clean = cut.load_audio()[0].astype(np.float64)
    mixed = augmenter(tiny_corpus, noise_prob=1.0, noise_snr=[6.0, 6.0], noise_source=str(folder)).augmented(cut, 0)
    noise = mixed.load_audio()[0] - clean
    assert 10 * math.log10(energy(clean) / energy(noise)) == pytest.approx(6.0, abs=0.05)
    spectrum = np.abs(np.fft.rfft(noise))
    assert np.fft.rfftfreq(len(noise), 1 / 16000)[spectrum.argmax()] == pytest.approx(120, abs=2)
    echoed = augmenter(tiny_corpus, reverb_prob=1.0, rir_source=str(rooms)).augmented(cut, 0).load_audio()[0]
    expected = clean + 0.5 * np.concatenate([np.zeros(400), clean[:-400]])
    scale = np.dot(echoed, expected) / np.dot(expected, expected)
    np.testing.assert_allclose(echoed, scale * expected, atol=2e-3 * np.abs(echoed).max())

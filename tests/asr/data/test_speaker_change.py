"""data.augment.speaker_*: formant and pitch shifts measured on a synthetic vowel of known formants and
pitch (formants by LPC in numpy, F0 by Praat's tracker), the draws, and bad values."""
import math

import numpy as np
import pytest
import scipy.linalg
import scipy.signal
import torch
from lhotse import CutSet

from asr.data.features.features import FilterBank
from asr.data.augment.speaker_change import SpeakerChange, change_speaker, draw_speaker_change, pitch_track
from asr.data.augment.waveform_augmentation import (AugmentConfig, WaveformAugmenter, transforms_on_the_fly,
                                                    validate_augment_config)

SR = 16000
FORMANTS = (700.0, 1200.0, 2600.0)


def vowel(f0=120.0, seconds=1.0, glide=0.0, formants=FORMANTS, bandwidths=(80.0, 90.0, 120.0)):
    """A pulse train at f0 (gliding by +-glide/2 over the vowel) through one resonator per formant."""
    n = int(SR * seconds)
    t = np.arange(n) / SR
    phase = np.cumsum(f0 * (1.0 + glide * (t / seconds - 0.5))) / SR
    signal = np.zeros(n)
    signal[np.nonzero(np.diff(np.floor(phase)) > 0)[0] + 1] = 1.0
    for frequency, bandwidth in zip(formants, bandwidths):
        radius, angle = math.exp(-math.pi * bandwidth / SR), 2 * math.pi * frequency / SR
        signal = scipy.signal.lfilter([1 - radius], [1, -2 * radius * math.cos(angle), radius ** 2], signal)
    return 0.5 * signal / np.abs(signal).max()


def lpc_formants(samples, order=10):
    """The three lowest formants: roots of an LPC polynomial (autocorrelation method) per 30 ms frame,
    the median over the frames of the middle of the vowel."""
    emphasised = scipy.signal.lfilter([1, -0.63], [1], samples)
    frame, estimates = int(0.03 * SR), []
    for start in range(int(0.2 * SR), len(samples) - int(0.2 * SR) - frame, int(0.01 * SR)):
        windowed = emphasised[start:start + frame] * np.hamming(frame)
        r = np.correlate(windowed, windowed, "full")[frame - 1:frame + order]
        roots = np.roots(np.concatenate([[1.0], scipy.linalg.solve_toeplitz(r[:order], -r[1:order + 1])]))
        roots = roots[np.imag(roots) > 0]
        frequencies = np.angle(roots) * SR / (2 * np.pi)
        bandwidths = -np.log(np.abs(roots)) * SR / np.pi
        found = np.sort(frequencies[(frequencies > 150) & (bandwidths < 500)])
        if len(found) >= 3:
            estimates.append(found[:3])
    return np.median(estimates, axis=0)


def median_f0(samples):
    return pitch_track(samples, SR)[2]


def f0_spread(samples):
    """The 10-90 percentile range of the voiced frames' F0."""
    pitch = pitch_track(samples, SR)[1].selected_array["frequency"]
    voiced = pitch[pitch > 0]
    return np.percentile(voiced, 90) - np.percentile(voiced, 10)


def test_the_reference_vowel_measures_as_built():
    x = vowel()
    np.testing.assert_allclose(lpc_formants(x), FORMANTS, rtol=0.04)
    assert median_f0(x) == pytest.approx(120.0, rel=0.01)


@pytest.mark.parametrize("ratio", [0.87, 1.15])
def test_formant_ratio_moves_every_formant_by_the_ratio_and_keeps_pitch_and_length(ratio):
    x = vowel()
    y = change_speaker(x, SR, SpeakerChange(ratio, 1.0, 1.0))
    assert len(y) == len(x)
    np.testing.assert_allclose(lpc_formants(y) / lpc_formants(x), ratio, rtol=0.03)
    assert median_f0(y) == pytest.approx(median_f0(x), rel=0.02)


@pytest.mark.parametrize("factor", [0.8, 1.25])
def test_pitch_factor_moves_f0_by_the_factor_and_keeps_the_formants(factor):
    x = vowel()
    y = change_speaker(x, SR, SpeakerChange(1.0, factor, 1.0))
    assert median_f0(y) / median_f0(x) == pytest.approx(factor, rel=0.02)
    np.testing.assert_allclose(lpc_formants(y), lpc_formants(x), rtol=0.04)


def test_intonation_factor_scales_the_f0_excursions_around_the_median():
    gliding = vowel(glide=0.4)          # 96 .. 144 Hz
    for factor in (0.5, 2.0):
        y = change_speaker(gliding, SR, SpeakerChange(1.0, 1.0, factor))
        assert f0_spread(y) / f0_spread(gliding) == pytest.approx(factor, rel=0.1)
        assert median_f0(y) == pytest.approx(median_f0(gliding), rel=0.02)


def test_the_new_median_stays_within_human_limits():
    y = change_speaker(vowel(f0=120.0), SR, SpeakerChange(1.0, 4.0, 1.0))   # 480 Hz asked: 350 Hz given
    assert median_f0(y) == pytest.approx(350.0, rel=0.02)


def test_unvoiced_input_gets_the_formant_shift_only_and_too_short_input_is_kept():
    noise = 0.1 * np.random.default_rng(0).standard_normal(SR // 2)
    assert math.isnan(median_f0(noise))
    shifted = change_speaker(noise, SR, SpeakerChange(1.2, 1.5, 1.0))
    assert len(shifted) == len(noise) and np.isfinite(shifted).all() and not np.allclose(shifted, noise)
    short = vowel(seconds=0.03)
    np.testing.assert_array_equal(change_speaker(short, SR, SpeakerChange(1.2, 1.5, 1.0)), short)


def test_praats_random_numbers_are_seeded_by_the_draw():
    x = vowel(glide=0.2)
    first, again, other = (change_speaker(x, SR, SpeakerChange(1.1, 1.2, 1.0, seed)) for seed in (7, 7, 8))
    np.testing.assert_array_equal(first, again)
    assert not np.array_equal(first, other)


def test_draws_are_fixed_by_seed_epoch_and_utterance_log_uniform_in_the_ranges():
    cfg = AugmentConfig(speaker_prob=0.5)
    draws = [draw_speaker_change(cfg, 0, epoch, f"u{i}") for epoch in range(4) for i in range(100)]
    assert draws == [draw_speaker_change(cfg, 0, epoch, f"u{i}") for epoch in range(4) for i in range(100)]
    assert draws[:100] != draws[100:200]                                            # another epoch
    assert draws[:100] != [draw_speaker_change(cfg, 1, 0, f"u{i}") for i in range(100)]   # another seed
    drawn = [d for d in draws if d is not None]
    assert 0.4 < len(drawn) / len(draws) < 0.6
    for key, name in (("speaker_formant_range", "formant_ratio"), ("speaker_pitch_range", "pitch_factor"),
                      ("speaker_intonation_range", "intonation_factor")):
        low, high = getattr(cfg, key)
        logs = np.log([getattr(d, name) for d in drawn])
        assert logs.min() >= math.log(low) and logs.max() <= math.log(high)
        assert np.mean(logs) == pytest.approx((math.log(low) + math.log(high)) / 2, abs=0.05 * math.log(high / low))
    assert all(draw_speaker_change(AugmentConfig(), 0, 0, f"u{i}") is None for i in range(100))


def cuts_of(root):
    return list(CutSet.from_file(root / "tiny_cuts_train.jsonl.gz"))


def test_the_augmenter_gives_each_drawn_utterance_the_changed_voice(tiny_corpus):
    cuts = cuts_of(tiny_corpus)
    options = dict(speaker_prob=1.0, speaker_formant_range=[1.15, 1.15], speaker_pitch_range=[1.2, 1.2],
                   speaker_intonation_range=[1.0, 1.0])
    augmenter = WaveformAugmenter(AugmentConfig(**options), 0, FilterBank(40), cuts)
    cut = cuts[0]
    clean = cut.load_audio()[0]
    out = augmenter.augmented(cut, 0).load_audio()[0]
    change = draw_speaker_change(augmenter.cfg, 0, 0, cut.id)
    assert (change.formant_ratio, change.pitch_factor, change.intonation_factor) == pytest.approx((1.15, 1.2, 1.0))
    expected = change_speaker(clean, SR, change)
    np.testing.assert_allclose(out, expected, atol=1e-6)          # float32 in memory
    assert len(out) == len(clean)
    stored = type("Plain", (), {"load": staticmethod(lambda c: FilterBank(40)(c.load_audio()[0]))})()
    assert augmenter.features(cut, 0, stored).shape == stored.load(cut).shape


def test_speaker_draws_repeat_per_epoch_and_leave_the_other_transforms_draws_alone(tiny_corpus):
    cuts = cuts_of(tiny_corpus)[:4]
    stored = type("Plain", (), {"load": staticmethod(lambda c: FilterBank(40)(c.load_audio()[0]))})()

    def features(epoch, **options):
        augmenter = WaveformAugmenter(AugmentConfig(**options), 5, FilterBank(40), cuts_of(tiny_corpus))
        return [augmenter.features(c, epoch, stored) for c in cuts]

    on = features(2, speaker_prob=1.0)
    assert all(torch.equal(a, b) for a, b in zip(on, features(2, speaker_prob=1.0)))
    assert all(not torch.equal(a, b) for a, b in zip(on, features(3, speaker_prob=1.0)))
    # off, whatever its ranges: the other transforms draw exactly what they drew without it
    other = dict(volume_prob=0.5, channel_prob=0.5)
    reference = features(2, **other)
    unchanged = features(2, **other, speaker_prob=0.0, speaker_formant_range=[0.7, 0.8], speaker_pitch_range=[2.0, 3.0])
    assert all(torch.equal(a, b) for a, b in zip(reference, unchanged))
    assert not transforms_on_the_fly(AugmentConfig()) and transforms_on_the_fly(AugmentConfig(speaker_prob=0.1))


@pytest.mark.parametrize("options, message", [
    ({"speaker_prob": 1.5}, "data.augment.speaker_prob=1.5 must be a probability in [0, 1]"),
    ({"speaker_formant_range": [0.4, 1.2]},
     "data.augment.speaker_formant_range=[0.4, 1.2] must be [low, high] with 0.5 <= low <= high <= 2.0"),
    ({"speaker_pitch_range": [2.0, 1.0]},
     "data.augment.speaker_pitch_range=[2.0, 1.0] must be [low, high] with 0.25 <= low <= high <= 4.0"),
    ({"speaker_intonation_range": [1.0]},
     "data.augment.speaker_intonation_range=[1.0] must be [low, high] with 0.25 <= low <= high <= 4.0"),
])
def test_bad_speaker_values_are_refused_naming_the_key_and_the_allowed_range(options, message):
    with pytest.raises(ValueError) as error:
        validate_augment_config(AugmentConfig(**options))
    assert message in str(error.value)


def test_training_batches_with_speakers_repeat_with_workers_and_evaluation_batches_are_untouched(tiny_corpus):
    from asr.data.config import DataConfig
    from asr.data.datamodule import SpeechDataModule

    def batches(loader_of, **overrides):
        cfg = DataConfig(corpus="tiny", root=str(tiny_corpus), max_duration=8.0, progress=False, feature_jobs=1,
                         targets=["phones"], specaugment=False, **overrides)
        module = SpeechDataModule(cfg, seed=7)
        module.setup("fit")
        return [b["features"] for b in getattr(module, loader_of)()]

    speakers = AugmentConfig(speaker_prob=0.5)
    plain, changed = batches("train_dataloader"), batches("train_dataloader", augment=speakers)
    assert [x.shape for x in plain] == [x.shape for x in changed]
    assert any(not torch.equal(x, y) for x, y in zip(plain, changed))
    in_workers = batches("train_dataloader", augment=speakers, num_workers=2)   # fresh Praat in each process
    assert all(torch.equal(x, y) for x, y in zip(changed, in_workers))
    assert all(torch.equal(x, y) for x, y in zip(batches("val_dataloader"), batches("val_dataloader", augment=speakers)))

"""data.augment.vtlp_*: the warp against its closed form (written out here, Jaitly & Hinton 2013 with
F_hi = 4800 Hz at an 8 kHz top), its effect on features of a peak and of a tone, the batch (lengths,
padding, the draws), the data module, and bad values."""
import math

import numpy as np
import pytest
import torch

from asr.data.config import DataConfig

from asr.data.datamodule import SpeechDataModule
from asr.data.features.features import FilterBank
from asr.data.augment.vtlp import VocalTractLengthPerturbation, unwarp_frequency, warp_frequency
from asr.data.augment.waveform_augmentation import AugmentConfig, validate_augment_config

TOP = 8000.0
ALPHAS = (0.8, 0.9, 1.1, 1.25)


def closed_form_warp(f, alpha):
    """Jaitly & Hinton's warp: alpha f up to F_hi min(alpha, 1) / alpha, then a line to (top, top)."""
    f_hi = 4800.0
    if f <= f_hi * min(alpha, 1.0) / alpha:
        return alpha * f
    return TOP - (TOP - f_hi * min(alpha, 1.0)) / (TOP - f_hi * min(alpha, 1.0) / alpha) * (TOP - f)


def mel(f):
    return 1127.0 * math.log(1.0 + f / 700.0)


MEL_DELTA = (mel(TOP) - mel(20.0)) / 41     # Kaldi's 40 filters from 20 Hz to the top: centres mel(20) + (m + 1) delta


def kaldi_centre_position(frequency_hz):
    """The fractional mel bin whose centre is at frequency_hz."""
    return (mel(frequency_hz) - mel(20.0)) / MEL_DELTA - 1.0


def kaldi_centre_hz(position):
    return 700.0 * (math.exp((mel(20.0) + (position + 1) * MEL_DELTA) / 1127.0) - 1.0)


def parabolic_peak(values):
    """The fractional position of the maximum: the vertex of the parabola through the top three bins."""
    values = np.asarray(values, dtype=np.float64)
    top = int(values.argmax())
    left, mid, right = values[max(top - 1, 0)], values[top], values[min(top + 1, len(values) - 1)]
    return top + 0.5 * (left - right) / (left - 2 * mid + right)


def vtlp(probability=1.0, warp_range=(0.8, 1.25), seed=0, bins=40):
    return VocalTractLengthPerturbation(probability, warp_range, seed, FilterBank(bins))


@pytest.mark.parametrize("alpha", ALPHAS + (1.0,))
def test_the_warp_is_the_closed_form_keeps_the_range_and_its_inverse_undoes_it(alpha):
    frequencies = np.linspace(0.0, TOP, 801)
    expected = np.array([closed_form_warp(f, alpha) for f in frequencies])
    np.testing.assert_allclose(warp_frequency(frequencies, alpha, TOP), expected, rtol=1e-12, atol=1e-9)
    assert expected[0] == 0.0 and expected[-1] == pytest.approx(TOP) and np.all(np.diff(expected) > 0)
    np.testing.assert_allclose(unwarp_frequency(expected, alpha, TOP), frequencies, atol=1e-9)


def test_alpha_one_is_the_identity():
    warp = vtlp()
    np.testing.assert_allclose(warp.source_positions(1.0), np.arange(40), atol=1e-9)
    features = torch.randn(50, 40)
    torch.testing.assert_close(warp.warp(features, 1.0), features, atol=1e-5, rtol=0)


@pytest.mark.parametrize("alpha", ALPHAS)
@pytest.mark.parametrize("peak_bin", [6, 15, 24, 33])
def test_a_peak_at_bin_k_moves_to_the_bin_of_the_warped_frequency(alpha, peak_bin):
    bins = np.arange(40)
    features = torch.from_numpy(10.0 - 0.5 * (bins - peak_bin) ** 2 / 1.5 ** 2).float().repeat(3, 1)
    out = vtlp().warp(features, alpha)[0].numpy()
    expected = kaldi_centre_position(closed_form_warp(kaldi_centre_hz(peak_bin), alpha))
    assert parabolic_peak(out) == pytest.approx(expected, abs=0.25)


@pytest.mark.parametrize("tone_hz, alpha", [(500.0, 1.25), (1000.0, 1.2), (1000.0, 0.85), (2000.0, 0.8), (3000.0, 1.25),
                                            (5000.0, 1.25), (6000.0, 0.8)])
def test_warped_features_of_a_tone_peak_where_the_warped_tone_does(tone_hz, alpha):
    filterbank = FilterBank(40)
    t = np.arange(8000) / 16000

    def tone_features(hz):
        return filterbank(0.3 * np.sin(2 * np.pi * hz * t) + 1e-3 * np.random.default_rng(0).standard_normal(t.size))

    before = parabolic_peak(tone_features(tone_hz).mean(0))
    warped = parabolic_peak(vtlp().warp(tone_features(tone_hz), alpha).mean(0))
    target = parabolic_peak(tone_features(closed_form_warp(tone_hz, alpha)).mean(0))
    assert abs(target - before) >= 1.0 and warped == pytest.approx(target, abs=0.5)   # moved a bin or more, to there


def test_a_batch_keeps_lengths_and_zero_padding_and_warps_only_the_drawn_rows():
    warp = vtlp(probability=0.5, seed=3)
    ids = [f"utt{i}" for i in range(8)]
    lengths = torch.tensor([30, 12, 25, 7, 30, 18, 3, 22])
    features = torch.zeros(8, 30, 40)
    for row, length in enumerate(lengths.tolist()):
        features[row, :length] = torch.randn(length, 40)
    out = warp(features, lengths, ids, epoch=2)
    assert out.shape == features.shape
    for row, (cut_id, length) in enumerate(zip(ids, lengths.tolist())):
        assert not out[row, length:].any()
        alpha = warp.warp_factor(cut_id, 2)
        expected = features[row, :length] if alpha is None else warp.warp(features[row, :length], alpha)
        assert torch.equal(out[row, :length], expected)
    drawn = [warp.warp_factor(i, 2) for i in ids]
    assert any(a is None for a in drawn) and any(a is not None for a in drawn)


def test_draws_are_fixed_by_seed_epoch_and_utterance_log_uniform_in_the_range():
    warp = vtlp(probability=0.5)
    draws = [warp.warp_factor(f"u{i}", epoch) for epoch in range(4) for i in range(200)]
    assert draws == [vtlp(probability=0.5).warp_factor(f"u{i}", epoch) for epoch in range(4) for i in range(200)]
    assert draws[:200] != draws[200:400]
    assert draws[:200] != [vtlp(probability=0.5, seed=1).warp_factor(f"u{i}", 0) for i in range(200)]
    alphas = np.array([a for a in draws if a is not None])
    assert 0.4 < len(alphas) / len(draws) < 0.6
    assert alphas.min() >= 0.8 and alphas.max() <= 1.25
    assert np.mean(np.log(alphas)) == pytest.approx(0.0, abs=0.03)         # log-uniform on [0.8, 1/0.8]
    assert all(vtlp(probability=0.0).warp_factor(f"u{i}", 0) is None for i in range(100))


def test_features_of_another_bin_count_are_refused():
    with pytest.raises(ValueError, match="VTLP was set up for 40 mel bins, got features with 80"):
        vtlp().warp(torch.zeros(5, 80), 1.1)


def config(root, **overrides):
    options = dict(corpus="tiny", root=str(root), max_duration=8.0, progress=False, feature_jobs=1,
                   targets=["phones"])
    options.update(overrides)
    return DataConfig(**options)


def batches(root, loader_of="train_dataloader", **overrides):
    module = SpeechDataModule(config(root, **overrides), seed=7)
    module.setup("fit")
    loader = getattr(module, loader_of)()
    return loader, list(loader)


def test_vtlp_in_training_batches_only_before_specaugment_and_repeatable(tiny_corpus):
    _, plain = batches(tiny_corpus, specaugment=False)
    _, warped = batches(tiny_corpus, specaugment=False, augment=AugmentConfig(vtlp_prob=1.0))
    for a, b in zip(plain, warped):
        assert a["ids"] == b["ids"] and torch.equal(a["feature_lengths"], b["feature_lengths"])
        assert not torch.equal(a["features"], b["features"])
        for row, length in enumerate(b["feature_lengths"].tolist()):
            assert not b["features"][row, length:].any()
    _, again = batches(tiny_corpus, specaugment=False, augment=AugmentConfig(vtlp_prob=1.0))
    assert all(torch.equal(a["features"], b["features"]) for a, b in zip(warped, again))
    # SpecAugment then masks the warped features, where it masks them without VTLP (its draws come
    # from the batch's ids): masked values as there, the rest the warped features
    _, masked = batches(tiny_corpus, augment=AugmentConfig(vtlp_prob=1.0))
    _, masked_plain = batches(tiny_corpus)
    for with_vtlp, without, unmasked, warped_only in zip(masked, masked_plain, plain, warped):
        mask = without["features"] != unmasked["features"]
        assert mask.any()
        assert torch.equal(with_vtlp["features"][mask], without["features"][mask])
        assert torch.equal(with_vtlp["features"][~mask], warped_only["features"][~mask])
    _, val_plain = batches(tiny_corpus, "val_dataloader")
    _, val_warped = batches(tiny_corpus, "val_dataloader", augment=AugmentConfig(vtlp_prob=1.0))
    assert all(torch.equal(a["features"], b["features"]) for a, b in zip(val_plain, val_warped))


def test_both_transforms_off_by_default_leave_batches_byte_identical(tiny_corpus):
    loader, default = batches(tiny_corpus)
    assert loader.dataset.augmenter is None and loader.dataset.vtlp is None
    assert AugmentConfig().speaker_prob == 0.0 and AugmentConfig().vtlp_prob == 0.0
    _, ranges_only = batches(tiny_corpus, augment=AugmentConfig(
        speaker_formant_range=[0.7, 0.8], speaker_pitch_range=[2.0, 3.0], vtlp_warp_range=[1.3, 1.5]))
    for a, b in zip(default, ranges_only):
        assert a["ids"] == b["ids"] and torch.equal(a["features"], b["features"])


@pytest.mark.parametrize("options, message", [
    ({"vtlp_prob": -0.1}, "data.augment.vtlp_prob=-0.1 must be a probability in [0, 1]"),
    ({"vtlp_warp_range": [0.8, 2.5]}, "data.augment.vtlp_warp_range=[0.8, 2.5] must be [low, high] with 0.5 <= low <= high <= 2.0"),
    ({"vtlp_warp_range": [1.2, 0.9]}, "data.augment.vtlp_warp_range=[1.2, 0.9] must be [low, high] with 0.5 <= low <= high <= 2.0"),
])
def test_bad_vtlp_values_are_refused_naming_the_key_and_the_allowed_range(options, message):
    with pytest.raises(ValueError) as error:
        validate_augment_config(AugmentConfig(**options))
    assert message in str(error.value)

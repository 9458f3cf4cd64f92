"""FilterBank against kaldi-native-fbank, an independent C++ implementation of Kaldi's fbank.

Tolerance: 2e-3 absolute on the log mel energies (values span about -16 .. 30). kaldi-native-fbank
computes in float32, FilterBank in float64; the largest difference measured is about 6e-4.
"""

import shutil
import subprocess

import kaldi_native_fbank as knf
import numpy as np
import pytest
import soundfile

from asr.data.features.features import FilterBank

TOLERANCE = 2e-3


def kaldi_fbank(waveform: np.ndarray, num_mel_bins: int, sampling_rate: int = 16000) -> np.ndarray:
    options = knf.FbankOptions()
    options.frame_opts.dither = 0.0
    options.frame_opts.samp_freq = sampling_rate
    options.mel_opts.num_bins = num_mel_bins
    computer = knf.OnlineFbank(options)
    # Kaldi computes on 16-bit sample values; FilterBank takes [-1, 1] floats and scales them itself.
    computer.accept_waveform(sampling_rate, (waveform.astype(np.float64) * 32768.0).tolist())
    computer.input_finished()
    frames = [computer.get_frame(i) for i in range(computer.num_frames_ready)]
    return np.array(frames).reshape(len(frames), num_mel_bins)


def chirp_noise_silence(seconds: float = 2.37, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    t = np.arange(int(seconds * 16000)) / 16000
    x = 0.3 * np.sin(2 * np.pi * (100 * t + 3000 * t ** 2 / (2 * seconds))) + 0.01 * rng.standard_normal(t.size)
    x[5000:8000] = 0.0  # digital silence: the log floor
    return x.astype(np.float32)


@pytest.mark.parametrize("num_mel_bins", [40, 80])
def test_matches_kaldi_native_fbank_on_chirp_noise_and_silence(num_mel_bins):
    audio = chirp_noise_silence()
    ours = FilterBank(num_mel_bins)(audio).numpy()
    reference = kaldi_fbank(audio, num_mel_bins)
    assert ours.shape == reference.shape == (FilterBank(num_mel_bins).num_frames(len(audio)), num_mel_bins)
    np.testing.assert_allclose(ours, reference, atol=TOLERANCE, rtol=0)
    assert reference.min() < -15  # the silent stretch reached the floor, log(FLT_EPSILON)


def test_matches_kaldi_native_fbank_on_speech_like_audio():
    from synthetic_corpus import synthetic_speech

    audio = synthetic_speech(1.3, np.random.default_rng(5))
    np.testing.assert_allclose(FilterBank(40)(audio).numpy(), kaldi_fbank(audio, 40), atol=TOLERANCE, rtol=0)


@pytest.mark.skipif(shutil.which("espeak-ng") is None, reason="espeak-ng not installed")
def test_matches_kaldi_native_fbank_on_espeak_speech(tmp_path):
    path = tmp_path / "speech.wav"
    subprocess.run(["espeak-ng", "-w", str(path), "the quick brown fox jumps over the lazy dog"], check=True,
                   capture_output=True)
    audio, rate = soundfile.read(path, dtype="float32")
    ours = FilterBank(40, sampling_rate=rate)(audio).numpy()  # espeak-ng writes 22050 Hz: another FFT layout
    np.testing.assert_allclose(ours, kaldi_fbank(audio, 40, rate), atol=TOLERANCE, rtol=0)


@pytest.mark.parametrize("num_samples", [399, 400, 401, 559, 560, 16000])
def test_frame_count_is_kaldis_snip_edges_count(num_samples):
    audio = np.random.default_rng(1).uniform(-0.5, 0.5, num_samples).astype(np.float32)
    expected = kaldi_fbank(audio, 40).shape[0]
    assert FilterBank(40).num_frames(num_samples) == expected
    assert FilterBank(40)(audio).shape == (expected, 40)


def test_cache_key_changes_with_every_option():
    keys = {FilterBank(40).cache_key, FilterBank(80).cache_key, FilterBank(40, low_freq=40).cache_key,
            FilterBank(40, frame_shift_ms=12.5).cache_key}
    assert len(keys) == 4
    assert FilterBank(40).cache_key == FilterBank(40).cache_key


def test_rejects_multichannel_input():
    with pytest.raises(ValueError, match="1-D mono"):
        FilterBank(40)(np.zeros((2, 1600), np.float32))

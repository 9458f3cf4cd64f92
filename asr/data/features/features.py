"""Kaldi-compatible log-mel filter-bank features (Kaldi's `compute-fbank-feats` with dither 0).

The computation follows Kaldi's `FbankComputer` step by step, with Kaldi's defaults except dither:

    frames of 25 ms every 10 ms, only whole frames (snip_edges=true: 1 + (N - 400) // 160 frames)
    -> remove each frame's DC offset -> pre-emphasis 0.97 (x[0] -= 0.97 x[0]) -> Povey window
    -> zero-pad to 512 -> power spectrum -> triangular mel filters (20 Hz .. Nyquist, mel = 1127 ln(1 + f/700))
    -> log(max(energy, FLT_EPSILON))

Decisions where Kaldi leaves a choice:
- dither 0 (Kaldi's default is 1.0): features are deterministic, so a cache on disk and a
  recomputation on the fly give the same numbers.
- Waveforms come in as floats in [-1, 1] (what soundfile and lhotse return) and are scaled by
  32768 first, because Kaldi reads 16-bit samples as integers; the features therefore equal those
  of `compute-fbank-feats` on the same WAV file (up to float rounding).

`tests/asr/data/test_filterbank.py` checks this against kaldi-native-fbank (an independent C++
implementation of Kaldi's fbank).
"""

from __future__ import annotations

import hashlib
import json
import math

import numpy as np
import torch

SAMPLING_RATE = 16000
# Kaldi's floor inside the log (std::numeric_limits<float>::epsilon()).
FLT_EPSILON = float(np.finfo(np.float32).eps)
# float [-1, 1] -> the int16 scale Kaldi computes on.
INT16_SCALE = 32768.0


def mel_scale(frequency_hz: np.ndarray | float) -> np.ndarray | float:
    """Kaldi's mel scale: 1127 ln(1 + f / 700)."""
    return 1127.0 * np.log(1.0 + np.asarray(frequency_hz, dtype=np.float64) / 700.0)


def inverse_mel_scale(mel: np.ndarray | float) -> np.ndarray | float:
    """The frequency in Hz of a mel value: 700 (exp(mel / 1127) - 1)."""
    return 700.0 * (np.exp(np.asarray(mel, dtype=np.float64) / 1127.0) - 1.0)


def mel_filter_range(sampling_rate: float, low_freq: float, high_freq: float) -> tuple[float, float]:
    """(lowest, highest) frequency in Hz the mel filters span: as Kaldi, `high_freq <= 0` means
    Nyquist + high_freq."""
    nyquist = 0.5 * sampling_rate
    if high_freq <= 0.0:
        high_freq = nyquist + high_freq
    if not 0.0 <= low_freq < high_freq <= nyquist:
        raise ValueError(f"mel filter range low_freq={low_freq} .. high_freq={high_freq} must lie in "
                         f"[0, {nyquist}] with low_freq < high_freq")
    return float(low_freq), float(high_freq)


def kaldi_mel_banks(num_mel_bins: int, fft_size: int, sampling_rate: float,
                    low_freq: float = 20.0, high_freq: float = 0.0) -> np.ndarray:
    """Kaldi's triangular mel filters as a (num_mel_bins, fft_size // 2 + 1) matrix.

    As in Kaldi's MelBanks, the Nyquist bin gets weight 0 and `high_freq <= 0` means Nyquist + high_freq.
    """
    low_freq, high_freq = mel_filter_range(sampling_rate, low_freq, high_freq)
    num_fft_bins = fft_size // 2
    mel_low, mel_high = mel_scale(low_freq), mel_scale(high_freq)
    mel_delta = (mel_high - mel_low) / (num_mel_bins + 1)
    bin_mel = mel_scale(np.arange(num_fft_bins) * (sampling_rate / fft_size))  # (num_fft_bins,)
    left = mel_low + mel_delta * np.arange(num_mel_bins)[:, None]
    center, right = left + mel_delta, left + 2.0 * mel_delta
    rising = (bin_mel - left) / (center - left)
    falling = (right - bin_mel) / (right - center)
    weights = np.where(bin_mel <= center, rising, falling)
    weights = np.where((bin_mel > left) & (bin_mel < right), weights, 0.0)
    banks = np.zeros((num_mel_bins, num_fft_bins + 1))
    banks[:, :num_fft_bins] = weights
    return banks


class FilterBank:
    """Log-mel filter-bank features of a 16 kHz mono waveform: `FilterBank(40)(waveform) -> (T, 40)`.

    `waveform`: 1-D float array or tensor in [-1, 1]. Output: float32 tensor (T, num_mel_bins) with
    T = `num_frames(len(waveform))`; a waveform shorter than one frame gives (0, num_mel_bins).
    """

    def __init__(self, num_mel_bins: int, sampling_rate: int = SAMPLING_RATE,
                 frame_length_ms: float = 25.0, frame_shift_ms: float = 10.0,
                 low_freq: float = 20.0, high_freq: float = 0.0, preemphasis: float = 0.97):
        if num_mel_bins < 1:
            raise ValueError(f"num_mel_bins must be positive, got {num_mel_bins}")
        self.num_mel_bins = int(num_mel_bins)
        self.sampling_rate = int(sampling_rate)
        self.frame_length_ms = float(frame_length_ms)
        self.frame_shift_ms = float(frame_shift_ms)
        self.low_freq = float(low_freq)
        self.high_freq = float(high_freq)
        self.preemphasis = float(preemphasis)
        self.frame_length = int(self.sampling_rate * self.frame_length_ms / 1000.0)
        self.frame_shift = int(self.sampling_rate * self.frame_shift_ms / 1000.0)
        self.fft_size = 1 << math.ceil(math.log2(self.frame_length))
        n = np.arange(self.frame_length)
        povey = (0.5 - 0.5 * np.cos(2.0 * np.pi * n / (self.frame_length - 1))) ** 0.85
        self._window = torch.from_numpy(povey)
        banks = kaldi_mel_banks(self.num_mel_bins, self.fft_size, self.sampling_rate,
                                self.low_freq, self.high_freq)
        self._mel_banks_t = torch.from_numpy(banks.T.copy())  # (fft_size // 2 + 1, num_mel_bins)

    @property
    def options(self) -> dict:
        """Every option that changes the numbers; a feature cache is keyed on these."""
        return {"type": "kaldi_fbank", "num_mel_bins": self.num_mel_bins,
                "sampling_rate": self.sampling_rate, "frame_length_ms": self.frame_length_ms,
                "frame_shift_ms": self.frame_shift_ms, "low_freq": self.low_freq,
                "high_freq": self.high_freq, "preemphasis": self.preemphasis, "dither": 0.0,
                "snip_edges": True, "input_scale": INT16_SCALE}

    # options of `options` that this implementation does not let change
    FIXED_OPTIONS = {"type": "kaldi_fbank", "dither": 0.0, "snip_edges": True, "input_scale": INT16_SCALE}

    @classmethod
    def from_options(cls, options: dict) -> "FilterBank":
        """The filter bank whose `options` are `options` (what a checkpoint stores); ValueError
        naming the option if they describe features this implementation does not compute."""
        options = dict(options)
        for key, value in cls.FIXED_OPTIONS.items():
            given = options.pop(key, value)
            if given != value:
                raise ValueError(f"front-end option {key}={given!r} is not supported "
                                 f"(this toolkit computes {key}={value!r})")
        try:
            return cls(**options)
        except TypeError:
            raise ValueError(f"front-end options {sorted(options)} are not those of a FilterBank") from None

    @property
    def cache_key(self) -> str:
        """A short folder name that changes whenever `options` change, e.g. 'fbank40-1a2b3c4d'."""
        digest = hashlib.sha1(json.dumps(self.options, sort_keys=True).encode()).hexdigest()[:8]
        return f"fbank{self.num_mel_bins}-{digest}"

    def num_frames(self, num_samples: int) -> int:
        """Kaldi's frame count with snip_edges=true: only frames that fit entirely."""
        if num_samples < self.frame_length:
            return 0
        return 1 + (num_samples - self.frame_length) // self.frame_shift

    def __call__(self, waveform) -> torch.Tensor:
        # np.array copies (to float64, which the computation below uses anyway): lhotse hands out
        # read-only arrays, which torch.as_tensor would share and warn about.
        samples = waveform if torch.is_tensor(waveform) else torch.from_numpy(np.array(waveform, dtype=np.float64))
        if samples.dim() != 1:
            raise ValueError(f"FilterBank expects a 1-D mono waveform, got shape {tuple(samples.shape)}")
        num_frames = self.num_frames(samples.numel())
        if num_frames == 0:
            return torch.zeros(0, self.num_mel_bins, dtype=torch.float32)
        # float64 throughout: the result then differs from Kaldi's float32 code by its rounding only.
        samples = samples.to(torch.float64) * INT16_SCALE
        frames = samples.unfold(0, self.frame_length, self.frame_shift)[:num_frames]
        frames = frames - frames.mean(dim=1, keepdim=True)
        emphasised = torch.empty_like(frames)
        emphasised[:, 1:] = frames[:, 1:] - self.preemphasis * frames[:, :-1]
        emphasised[:, 0] = frames[:, 0] * (1.0 - self.preemphasis)
        spectrum = torch.fft.rfft(emphasised * self._window, n=self.fft_size, dim=1)
        power = spectrum.real.square() + spectrum.imag.square()
        energies = power @ self._mel_banks_t
        return torch.log(energies.clamp_min(FLT_EPSILON)).to(torch.float32)

    def __repr__(self) -> str:
        return (f"FilterBank(num_mel_bins={self.num_mel_bins}, sampling_rate={self.sampling_rate}, "
                f"frame_length_ms={self.frame_length_ms}, frame_shift_ms={self.frame_shift_ms})")

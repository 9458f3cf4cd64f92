"""Vocal tract length perturbation (VTLP) of training features: `data.augment.vtlp_prob`, `vtlp_warp_range`.

A shorter vocal tract puts every formant higher by about the same factor. VTLP (Jaitly & Hinton,
"Vocal Tract Length Perturbation (VTLP) improves speech recognition", ICML 2013 workshop) draws a
warp factor alpha per utterance and stretches the frequency axis by it, so each training voice
also stands for speakers with shorter and longer vocal tracts. Here it works on the log-mel
filter-bank features of a batch (cached or computed on the fly alike), not on audio.

The warp (Jaitly & Hinton's equation, Kaldi's VTLN warp without its lower cutoff), in Hz, with
`top` the highest frequency of the mel filters (Nyquist, 8000 Hz at 16 kHz) and F_hi = 0.6 top
(their 4800 Hz at 8 kHz):

    b  = F_hi min(alpha, 1)                    the warped frequency of the breakpoint
    f0 = b / alpha                             the breakpoint
    W(f) = alpha f                             for f <= f0
    W(f) = top - (top - b) / (top - f0) (top - f)   for f0 < f <= top

W is continuous, increasing, W(0) = 0 and W(top) = top: the top stays in range and nothing is
pushed out of it. Energy at frequency f moves to W(f), so alpha > 1 moves formants up (a shorter
vocal tract), alpha < 1 down. The warped feature of mel bin m reads the original at the frequency
that W moves onto the bin's centre c_m:

    W^-1(g) = g / alpha                              for g <= b
    W^-1(g) = top - (top - f0) / (top - b) (top - g) for b < g <= top
    c_m = mel^-1(mel_low + (m + 1) delta)            Kaldi's centres: delta = (mel(top) - mel_low) / (M + 1)
    p_m = (mel(W^-1(c_m)) - mel_low) / delta - 1     the fractional bin it reads, clamped to [0, M - 1]
    y[t, m] = (1 - w) x[t, floor(p_m)] + w x[t, floor(p_m) + 1],   w = p_m - floor(p_m)

with mel(f) = 1127 ln(1 + f / 700) (asr/data/features/features.py).

Decisions where the paper is silent (it recomputes the filter bank with warped centres from audio):
- On cached features the log-mel energies are interpolated linearly along the mel-bin axis, in the
  log domain (what the model sees); a filter's bandwidth is not rescaled by the warp's slope, as
  re-centring the filters (the paper's way) does not rescale it either.
- Below the lowest bin centre and above the highest, the edge bin's value is used (p clamped).
- F_hi scales with the filters' top (0.6 top), so other sampling rates or a lower `high_freq` keep
  the paper's proportions.
- alpha is drawn log-uniformly in `vtlp_warp_range` (the paper: uniform in [0.9, 1.1]), so alpha
  and 1 / alpha are equally likely; the default range [0.8, 1.25] is the wide one (recipes/asterisk/RESULTS.md).

Determinism: whether an utterance is warped, and by how much, comes from a stream seeded with (the
run's seed, the epoch, the utterance id), so batches repeat with any batch size, workers or resume,
and each epoch draws afresh. Only the valid frames change: lengths and padding stay as they are.
"""
from __future__ import annotations

import hashlib
import math
import random
from typing import Sequence

import numpy as np
import torch

from asr.data.features.features import FilterBank, inverse_mel_scale, mel_filter_range, mel_scale

BREAKPOINT_SHARE = 0.6   # F_hi / top: Jaitly & Hinton's 4800 Hz at an 8 kHz top


def warp_frequency(frequency_hz: np.ndarray | float, alpha: float, top_hz: float) -> np.ndarray:
    """W(f): where the warp moves frequency f (the module doc's equation)."""
    f = np.asarray(frequency_hz, dtype=np.float64)
    warped_breakpoint = BREAKPOINT_SHARE * top_hz * min(alpha, 1.0)
    breakpoint = warped_breakpoint / alpha
    upper = top_hz - (top_hz - warped_breakpoint) / (top_hz - breakpoint) * (top_hz - f)
    return np.where(f <= breakpoint, alpha * f, upper)


def unwarp_frequency(frequency_hz: np.ndarray | float, alpha: float, top_hz: float) -> np.ndarray:
    """W^-1(g): the frequency the warp moves onto g."""
    g = np.asarray(frequency_hz, dtype=np.float64)
    warped_breakpoint = BREAKPOINT_SHARE * top_hz * min(alpha, 1.0)
    breakpoint = warped_breakpoint / alpha
    upper = top_hz - (top_hz - breakpoint) / (top_hz - warped_breakpoint) * (top_hz - g)
    return np.where(g <= warped_breakpoint, g / alpha, upper)


def vtlp_stream(seed: int, epoch: int, cut_id: str) -> random.Random:
    """The VTLP draws of one utterance in one epoch (its own stream: the other transforms' draws
    stay as they were whether VTLP is on or off)."""
    digest = hashlib.sha1(f"vtlp:{seed}:{epoch}:{cut_id}".encode()).hexdigest()
    return random.Random(int(digest[:16], 16))


class VocalTractLengthPerturbation:
    """Warps the frequency axis of training features: `vtlp(features, lengths, ids, epoch)` on a
    padded batch (B, T, M) of log-mel features from `filterbank`."""

    def __init__(self, probability: float, warp_range: Sequence[float], seed: int, filterbank: FilterBank):
        self.probability = float(probability)
        self.low, self.high = (float(a) for a in warp_range)
        self.seed = int(seed)
        self.num_bins = filterbank.num_mel_bins
        low_hz, self.top_hz = mel_filter_range(filterbank.sampling_rate, filterbank.low_freq, filterbank.high_freq)
        self.mel_low = float(mel_scale(low_hz))
        self.mel_delta = (float(mel_scale(self.top_hz)) - self.mel_low) / (self.num_bins + 1)
        self.centres_hz = inverse_mel_scale(self.mel_low + self.mel_delta * np.arange(1, self.num_bins + 1))

    def warp_factor(self, cut_id: str, epoch: int) -> float | None:
        """alpha of this utterance in this epoch, or None when it is not warped."""
        stream = vtlp_stream(self.seed, epoch, cut_id)
        if not stream.random() < self.probability:
            return None
        return math.exp(stream.uniform(math.log(self.low), math.log(self.high)))

    def source_positions(self, alpha: float) -> np.ndarray:
        """p_m: the fractional mel bin each output bin reads (the module doc), in [0, M - 1]."""
        source_hz = unwarp_frequency(self.centres_hz, alpha, self.top_hz)
        positions = (mel_scale(np.maximum(source_hz, 0.0)) - self.mel_low) / self.mel_delta - 1.0
        return np.clip(positions, 0.0, self.num_bins - 1)

    def warp(self, features: torch.Tensor, alpha: float) -> torch.Tensor:
        """(T, M) features of one utterance warped by alpha (interpolated between mel bins)."""
        if features.shape[-1] != self.num_bins:
            raise ValueError(f"VTLP was set up for {self.num_bins} mel bins, got features with {features.shape[-1]}")
        positions = torch.from_numpy(self.source_positions(alpha))
        below = positions.floor().to(torch.int64).clamp(max=self.num_bins - 2 if self.num_bins > 1 else 0)
        above = (below + 1).clamp(max=self.num_bins - 1)
        weight = (positions - below).to(features.dtype)
        return features[..., below] * (1.0 - weight) + features[..., above] * weight

    def __call__(self, features: torch.Tensor, lengths: torch.Tensor, ids: Sequence[str], epoch: int) -> torch.Tensor:
        """A copy of the padded batch `features` (B, T, M) with each drawn utterance's valid frames
        warped; padding frames and rows past `ids` are left as they are."""
        out = features.clone()
        for row, (cut_id, length) in enumerate(zip(ids, lengths.tolist())):
            alpha = self.warp_factor(cut_id, epoch)
            if alpha is not None and length > 0:
                out[row, :length] = self.warp(features[row, :length], alpha)
        return out

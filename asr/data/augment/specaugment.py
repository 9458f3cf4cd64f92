"""SpecAugment (Park et al., 2019): frequency and time masks on training features; no time warping.

Per utterance, `freq_masks` bands of width w ~ U{0..freq_mask_width} mel bins and `time_masks` bands of
width w ~ U{0..min(time_mask_width, floor(time_mask_max_fraction * T))} frames, each at a uniform start,
inside the utterance's valid frames only (padding is never touched). Bands may overlap.

Decision: the features in a batch are NOT normalised (the model normalises them with the global
statistics), so a masked value is set to the global mean of its dimension - after normalisation
that is 0, which is what SpecAugment on normalised features does.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class SpecAugment:
    # No defaults: they live in the data config's schema (asr.data.config.DataConfig).
    freq_masks: int
    freq_mask_width: int
    time_masks: int
    time_mask_width: int
    time_mask_max_fraction: float

    def __post_init__(self):
        for name in ("freq_masks", "freq_mask_width", "time_masks", "time_mask_width"):
            if int(getattr(self, name)) < 0:
                raise ValueError(f"SpecAugment {name} must be >= 0, got {getattr(self, name)}")
        if not 0.0 <= self.time_mask_max_fraction <= 1.0:
            raise ValueError(f"SpecAugment time_mask_max_fraction must be in [0, 1], got {self.time_mask_max_fraction}")

    def __call__(self, features: torch.Tensor, lengths: torch.Tensor, fill: torch.Tensor,
                 generator: torch.Generator) -> torch.Tensor:
        """Masked copy of `features` (B, T, F); `lengths` (B,) valid frames; `fill` (F,) masked value."""
        out = features.clone()
        num_bins = features.shape[2]
        fill = fill.to(out.dtype)

        def draw(high: int) -> int:  # uniform integer in [0, high]
            return int(torch.randint(0, high + 1, (1,), generator=generator))

        for b, length in enumerate(lengths.tolist()):
            if length == 0:
                continue
            for _ in range(self.freq_masks):
                width = draw(min(self.freq_mask_width, num_bins))
                start = draw(num_bins - width)
                out[b, :length, start:start + width] = fill[start:start + width]
            max_time_width = min(self.time_mask_width, int(self.time_mask_max_fraction * length))
            for _ in range(self.time_masks):
                width = draw(max_time_width)
                start = draw(length - width)
                out[b, start:start + width, :] = fill
        return out

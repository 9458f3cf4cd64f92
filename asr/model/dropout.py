"""Dropout whose mask is cheap to draw on the CPU.

torch's CPU dropout draws one Bernoulli sample per element, one call of the generator each (~9 ns on
the development machines): on a feed-forward block's hidden activations it costs twice the linear
layer that made them. `Dropout` draws the mask from 64-bit random integers, four 15-bit uniform
numbers from each (the lowest 63 bits of torch's int64 `random_()` are uniform), so the generator
runs a quarter as often; an element is dropped when its number is below round(p x 2^15). The
dropout probability is therefore p rounded to a multiple of 2^-15 (0.1 -> 0.100006), and the kept
elements are scaled by 1 / (1 - that probability), so the expected output is the input exactly, as
with torch's dropout. The mask comes from torch's default generator, so `torch.manual_seed` (and
Lightning's seeding) makes it repeat.

On other devices (CUDA's dropout is fast) and under torch.compile (which traces torch's own
dropout) it is torch's dropout. Like nn.Dropout it has no weights, so a model's state_dict is the
same with either.
"""
from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F

MASK_BITS = 15


def keep_mask(shape: torch.Size, p: float) -> tuple[torch.Tensor, float]:
    """(a CPU bool tensor of `shape`, True where an element is kept; the probability it is dropped)."""
    threshold = round(p * (1 << MASK_BITS))
    count = shape.numel()
    words = torch.empty((count + 3) // 4, dtype=torch.int64).random_()
    numbers = words.view(torch.int16)[:count].bitwise_and(0x7FFF)
    return numbers.ge(threshold).view(shape), threshold / (1 << MASK_BITS)


class Dropout(nn.Module):
    """nn.Dropout(p) with the CPU's mask drawn as the module docstring says."""

    def __init__(self, p: float = 0.5):
        super().__init__()
        if not 0.0 <= p <= 1.0:
            raise ValueError(f"dropout probability has to be between 0 and 1, but got {p}")
        self.p = p

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self.training or self.p == 0.0:
            return x
        if x.device.type != "cpu" or self.p == 1.0 or torch.compiler.is_compiling():
            return F.dropout(x, self.p, training=True)
        keep, dropped = keep_mask(x.shape, self.p)
        # in place on where's output: its backward keeps only the mask
        return torch.where(keep, x, 0.0).mul_(1.0 / (1.0 - dropped))

    def extra_repr(self) -> str:
        return f"p={self.p}"

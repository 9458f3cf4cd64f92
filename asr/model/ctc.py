"""CTC output layers (one per target kind), the CTC loss, and greedy decoding.

Blank is token 0 in every vocabulary (the tokenizers' `blank_id`).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

BLANK_ID = 0


class CTCHeads(nn.Module):
    """One linear layer per target kind, encoder states -> log-probabilities over its vocabulary.

    `vocab_sizes` maps a kind ("phones", "chars", "sentencepiece") to its vocabulary size
    including blank; the order of the mapping is kept (the first kind is the primary one).
    """

    def __init__(self, d_model: int, vocab_sizes: dict[str, int]):
        super().__init__()
        if not vocab_sizes:
            raise ValueError("a CTC model needs at least one target kind (data.targets is empty)")
        self.projections = nn.ModuleDict({kind: nn.Linear(d_model, size) for kind, size in vocab_sizes.items()})

    @property
    def kinds(self) -> list[str]:
        return list(self.projections.keys())

    def forward(self, states: torch.Tensor) -> dict[str, torch.Tensor]:
        """(B, T, D) -> {kind: (B, T, V_kind) log-probabilities}."""
        return {kind: F.log_softmax(proj(states).float(), dim=-1) for kind, proj in self.projections.items()}


def ctc_loss(log_probs: torch.Tensor, lengths: torch.Tensor,
             targets: torch.Tensor, target_lengths: torch.Tensor) -> torch.Tensor:
    """Mean over the batch of each utterance's CTC loss divided by its target length.

    (B, T, V) log-probs, (B,) lengths, (B, S) targets padded with anything, (B,) target lengths.
    `zero_infinity`: an utterance that cannot be aligned (more targets than frames) contributes
    0 instead of inf, so one bad utterance cannot poison a batch; the data module filters those
    out beforehand and says how many.
    """
    return F.ctc_loss(log_probs.transpose(0, 1), targets, lengths, target_lengths,
                      blank=BLANK_ID, reduction="mean", zero_infinity=True)


def greedy_decode(log_probs: torch.Tensor, lengths: torch.Tensor) -> list[list[int]]:
    """Best path decoding: argmax per frame, merge repeats, drop blanks.

    (B, T, V) scores (any monotone transform of probabilities), (B,) valid lengths ->
    one list of token ids per utterance. Frames past an utterance's length are ignored.
    """
    best = log_probs.argmax(dim=-1).cpu()
    decoded = []
    for path, length in zip(best, lengths.cpu().tolist()):
        path = path[:length]
        if length == 0:
            decoded.append([])
            continue
        keep = torch.ones_like(path, dtype=torch.bool)
        keep[1:] = path[1:] != path[:-1]          # first frame of every run
        keep &= path != BLANK_ID
        decoded.append(path[keep].tolist())
    return decoded

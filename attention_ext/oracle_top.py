"""Oracle-top attention: exact softmax restricted to each query's top-k keys.

An evaluation probe from the clustered-attention paper (Table 1, "oracle-top"): it
shows how much of full attention the k highest-scoring keys alone carry. It computes
every score, so it is quadratic like full attention; plain torch ops suffice.
"""
import math

import torch

from .contract import attend_by_valid_length, check_inputs
from .registry import Option, register_attention

# Scores computed at once per block of queries (elements), bounding peak memory for long sequences.
_SCORE_BLOCK_ELEMENTS = 1 << 24


@register_attention("oracle_top", options=(
    Option("topk", 32, 1, help="keys kept per query (those with the highest scores)"),
), summary="exact softmax over each query's top-k valid keys (an evaluation probe)",
   number_option="topk")
class OracleTopAttention(torch.nn.Module):
    """softmax over the `topk` largest q_i . k_j / sqrt(E) of each query's valid keys, times V.

    Keys are used as given (separate keys, or k = q). With topk >= the valid length
    every valid key is kept and the result is full attention. Ties at the k-th score
    are broken by torch.topk (exactly k keys are kept).
    """

    def __init__(self, topk: int = 32):
        super().__init__()
        self.topk = topk

    def extra_repr(self) -> str:
        return f"topk={self.topk}"

    def forward(self, q, k, v, lengths=None):
        lengths = check_inputs(q, k, v, lengths, attention=self)
        return attend_by_valid_length(self._attend, q, k, v, lengths)

    def _attend(self, q, k, v):
        """Top-k attention for sequences that are all valid up to their end."""
        batch, heads, length, dim = q.shape
        keep = min(self.topk, length)
        block = max(1, _SCORE_BLOCK_ELEMENTS // (batch * heads * length))
        key_t = k.transpose(-1, -2) / math.sqrt(dim)
        outputs = []
        for start in range(0, length, block):
            scores = q[:, :, start:start + block] @ key_t
            if keep < length:
                top = scores.topk(keep, dim=-1).indices
                kept = torch.zeros_like(scores, dtype=torch.bool).scatter_(-1, top, True)
                scores = scores.masked_fill(~kept, float("-inf"))
            outputs.append(torch.softmax(scores, dim=-1) @ v)
        return outputs[0] if len(outputs) == 1 else torch.cat(outputs, dim=2)

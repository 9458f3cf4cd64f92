"""Oracle-top attention: exact softmax restricted to each query's top-k keys.

An evaluation probe from the clustered-attention paper (Table 1, "oracle-top"): it
shows how much of full attention the k highest-scoring keys alone carry. It computes
every score, so it is quadratic like full attention; plain torch ops suffice.
"""
import math

import torch

from ..contract import check_inputs, valid_positions, zero_padded_queries, zeros_without_valid_queries
from ..registry import Option, register_attention
from .shared_full import visible_keys

# Scores computed at once per block of queries (elements), bounding peak memory for long sequences.
_SCORE_BLOCK_ELEMENTS = 1 << 24


@register_attention("oracle_top", options=(
    Option("topk", 32, 1, help="keys kept per query (those with the highest scores)"),
), summary="exact softmax over each query's top-k valid keys (an evaluation probe)",
   number_option="topk", quadratic_time=True)
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
        padded = lengths is not None
        lengths = check_inputs(q, k, v, lengths, attention=self)
        return oracle_top_attention(q, k, v, lengths, self.topk, padded)


def oracle_top_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, lengths: torch.Tensor, topk: int,
                         padded: bool = True, exclude_self: bool = False) -> torch.Tensor:
    """Softmax over each query's `topk` highest-scoring valid keys, times V (see OracleTopAttention).

    `padded=False` says every sequence is full (a call without lengths). `exclude_self`: the
    Reformer conventions of a shared-QK model (attention_ext.attentions.shared_full.visible_keys): a query's
    own key is not among those it may attend to (unless its sequence has length 1), so the
    top-k are taken among the other valid keys.
    """
    batch, heads, length, dim = q.shape
    if batch == 0 or length == 0:
        return zeros_without_valid_queries(q, k, v)
    keep = min(topk, length)
    # Given lengths, padded keys score -inf (whether any key is padded would be a host
    # synchronisation to ask), so they are kept only where a sequence has fewer than `keep`
    # valid keys, and then get no weight. A sequence of length 0 keeps key 0 (no empty
    # softmax row); padded query rows are zeroed at the end.
    if exclude_self:
        hidden = ~visible_keys(lengths, length)[:, None]                             # (B, 1, N, N)
    elif padded:
        hidden = ~valid_positions(lengths.clamp(min=1), length)[:, None, None, :]    # (B, 1, 1, N)
    else:
        hidden = None
    block = max(1, _SCORE_BLOCK_ELEMENTS // (batch * heads * length))
    key_t = k.transpose(-1, -2) / math.sqrt(dim)
    outputs = []
    for start in range(0, length, block):
        scores = q[:, :, start:start + block] @ key_t
        if hidden is not None:
            rows = hidden[:, :, start:start + block] if exclude_self else hidden
            scores = scores.masked_fill(rows, float("-inf"))
        if keep < length:
            top = scores.topk(keep, dim=-1).indices
            kept = torch.zeros_like(scores, dtype=torch.bool).scatter_(-1, top, True)
            scores = scores.masked_fill(~kept, float("-inf"))
        outputs.append(torch.softmax(scores, dim=-1) @ v)
    out = outputs[0] if len(outputs) == 1 else torch.cat(outputs, dim=2)
    return zero_padded_queries(out, lengths) if padded or exclude_self else out

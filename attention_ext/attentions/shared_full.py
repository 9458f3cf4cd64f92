"""Full softmax attention with shared queries and keys (the Reformer conventions).

A model with shared query/key projections (`model.shared_qk`) calls an attention
with k = q, the very same tensor. `shared_full` and `lsh` then use the Reformer
conventions (Kitaev et al. 2020, sec. 2):

* keys are the unit-normalised queries, k_j = q_j / ||q_j|| (differentiable; a zero
  query gives a zero key), logits are q_i . k_j / sqrt(E);
* a position does not attend to itself: its own key gets zero weight whenever any
  other valid key is available to it. Only a query with no other key (a sequence
  of valid length 1) attends to itself, so its output is its own value.

`shared_full` is the exact reference for `lsh`: it attends to every other valid key.
"""
import torch
import torch.nn.functional as F

from ..contract import check_inputs, zero_padded_queries, zeros_without_valid_queries
from ..registry import register_attention


@register_attention("shared_full", needs_shared_qk=True, quadratic_time=True,
                    summary="full attention with shared QK: unit keys, no attention to self")
class SharedFullAttention(torch.nn.Module):
    """softmax(Q K^T / sqrt(E)) V with K = Q / ||Q|| and the diagonal masked (see module doc).

    Requires k to be q. One call of torch's scaled_dot_product_attention on the padded batch,
    with a mask of the valid keys other than the query itself.
    """

    def forward(self, q, k, v, lengths=None):
        padded = lengths is not None
        lengths = check_inputs(q, k, v, lengths, attention=self)
        keys = unit_keys(q)
        if q.shape[0] == 0 or q.shape[2] == 0:
            return zeros_without_valid_queries(q, keys, v)
        length = q.shape[2]
        if not padded:   # a sequence of length 1 attends to itself
            position = torch.arange(length, device=q.device)
            not_self = position[:, None] != position[None, :]                     # (N, N)
            return F.scaled_dot_product_attention(q, keys, v, attn_mask=not_self | (length == 1))
        # Given lengths, every row is masked, padded or not (asking would be a host synchronisation).
        out = F.scaled_dot_product_attention(q, keys, v, attn_mask=visible_keys(lengths, length)[:, None])
        return zero_padded_queries(out, lengths)


def unit_keys(q: torch.Tensor) -> torch.Tensor:
    """The keys of the Reformer conventions: q / ||q|| (a zero query gives a zero key)."""
    if q.dtype == torch.float16:
        # eps 1e-12 rounds to 0 in float16, so a zero query would give a NaN key (and NaN
        # outputs for its whole sequence): normalise in float32
        return F.normalize(q.float(), dim=-1).to(q.dtype)
    return F.normalize(q, dim=-1)  # x / max(||x||, 1e-12)


def visible_keys(lengths: torch.Tensor, length: int) -> torch.Tensor:
    """(B, N, N) bool: the keys each query may attend to under the Reformer conventions, the
    valid keys other than its own. A sequence of length 1 keeps its own key, and one of length 0
    key 0, so that no row of a softmax is empty (padded query rows are zeroed by the caller)."""
    position = torch.arange(length, device=lengths.device)
    not_self = position[:, None] != position[None, :]                             # (N, N)
    valid = lengths.clamp(min=1)[:, None, None]                                   # (B, 1, 1)
    return (position[None, None, :] < valid) & (not_self | (valid == 1))

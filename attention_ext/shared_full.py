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

from .contract import attend_by_valid_length, check_inputs, is_shared_qk
from .registry import register_attention


def require_shared_qk(q: torch.Tensor, k: torch.Tensor, attention: str) -> None:
    """Raises ValueError unless k is q (the same tensor): these attentions only make sense
    for a model whose queries and keys come from one projection."""
    if not is_shared_qk(q, k):
        raise ValueError(
            f"attention '{attention}' needs a model with shared query/key projections: call it "
            "with k = q (the same tensor), e.g. build the model with shared_qk=True; it got a "
            "separate key tensor. Use 'full', 'clustered' or 'iclustered' for separate keys.")


@register_attention("shared_full",
                    summary="full attention with shared QK: unit keys, no attention to self",
                    needs_shared_qk=True)
class SharedFullAttention(torch.nn.Module):
    """softmax(Q K^T / sqrt(E)) V with K = Q / ||Q|| and the diagonal masked (see module doc).

    Requires k to be q. Sequences of equal valid length are computed together with
    torch's scaled_dot_product_attention on their valid rows only.
    """

    def forward(self, q, k, v, lengths=None):
        lengths = check_inputs(q, k, v, lengths)
        require_shared_qk(q, k, self.attention_name)
        if q.dtype == torch.float16:
            # eps 1e-12 rounds to 0 in float16, so a zero query would give a NaN key (and NaN
            # outputs for its whole sequence): normalise in float32
            keys = F.normalize(q.float(), dim=-1).to(q.dtype)
        else:
            keys = F.normalize(q, dim=-1)  # x / max(||x||, 1e-12)
        return attend_by_valid_length(self._attend, q, keys, v, lengths)

    @staticmethod
    def _attend(q, keys, v):
        """Attention over one group of sequences that are all valid up to their end."""
        length = q.shape[2]
        if length == 1:  # nothing but itself to attend to
            return v.clone()
        not_self = ~torch.eye(length, dtype=torch.bool, device=q.device)
        return F.scaled_dot_product_attention(q, keys, v, attn_mask=not_self)

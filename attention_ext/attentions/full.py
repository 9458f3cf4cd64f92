"""Full softmax attention through torch's scaled_dot_product_attention."""
import torch
import torch.nn.functional as F

from ..contract import check_inputs, valid_positions, zero_padded_queries
from ..registry import register_attention


@register_attention("full", quadratic_time=True, summary="softmax attention (torch scaled_dot_product_attention)")
class FullAttention(torch.nn.Module):
    """softmax(Q K^T / sqrt(E)) V over all valid keys."""

    def forward(self, q, k, v, lengths=None):
        lengths_given = lengths is not None
        lengths = check_inputs(q, k, v, lengths, attention=self)
        if not lengths_given:
            return F.scaled_dot_product_attention(q, k, v)
        # A sequence of length 0 keeps key 0 unmasked so softmax has no empty row;
        # its (padded) query rows are zeroed below anyway.
        key_mask = valid_positions(lengths.clamp(min=1), q.shape[2])[:, None, None, :]
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=key_mask)
        return zero_padded_queries(out, lengths)

"""Agglomerative attention (Spellings 2019, Methods, the non-masked "full" variant), adapted to
the parameter-free call contract of attention_ext.

The paper classifies every query and reference element softly into m classes,
c_i = softmax(x_i W + b), averages the reference elements of each class weighted by their
assignments, and gives each query its classes' averages weighted by its own assignment. Our
attention modules get q, k, v from the layer's projections and own no weights, so:

- class logits: the first m channels of q (query side) and of k (reference side); the layer's
  query and key projections play the role of W, b (the remaining channels are not used);
- class summaries: s_c = sum_j c^k_jc v_j / sum_j c^k_jc over the valid keys j;
- output: out_i = sum_c c^q_ic s_c.

Written as an attention matrix, out = A V with A_ij = sum_c c^q_ic c^k_jc / n_c, and every row of A
sums to 1 (sum_c c^q_ic = 1): a convex combination of the values, like softmax attention, so it
is a drop-in swap. The paper instead concatenates per-class projections of width d/m; that needs
m to divide the head dim and leaves each class a slice of the channels, while here multi-head
attention already gives each head its own projections. Cost O(N m E).
"""
import torch

from ..contract import (check_inputs, compute_dtype, valid_positions, zero_padded_queries,
                       zeros_without_valid_queries)
from ..registry import Option, check_options_fit_head_dim, register_attention


@register_attention("agglomerative", options=(
    Option("classes", 8, 1, help="soft classes m; their logits are the first m channels of q and k",
           at_most_head_dim=True),
), summary="agglomerative attention: soft classes from q and k, class means of v (Spellings 2019)",
   number_option="classes", compare_as="agglomerative-8")
class AgglomerativeAttention(torch.nn.Module):
    """out_i = sum_c softmax(q_i[:m])_c * (class c's assignment-weighted mean of the valid v_j)."""

    def __init__(self, classes: int = 8):
        super().__init__()
        self.classes = classes

    def extra_repr(self) -> str:
        return f"classes={self.classes}"

    def forward(self, q, k, v, lengths=None):
        lengths = check_inputs(q, k, v, lengths, attention=self)
        check_options_fit_head_dim(self.attention_name, {"classes": self.classes}, q.shape[3])
        if q.shape[0] == 0 or q.shape[2] == 0:
            return zeros_without_valid_queries(q, k, v)
        # A batch whose every length is 0 needs no test (a host synchronisation): every row is
        # masked, every class summary is 0, and so is the output (with zero gradients).
        dtype = compute_dtype(q.dtype)
        with torch.autocast(device_type=q.device.type, enabled=False):
            padded = ~valid_positions(lengths, q.shape[2])[:, None, :, None]
            # masked_fill, not a product with the mask: a non-finite padded value is dropped
            # (and gives no NaN gradient through the padded rows).
            query_classes = torch.softmax(q[..., :self.classes].to(dtype), dim=-1).masked_fill(padded, 0.0)
            key_classes = torch.softmax(k[..., :self.classes].to(dtype), dim=-1).masked_fill(padded, 0.0)
            values = v.to(dtype).masked_fill(padded, 0.0)
            sums = key_classes.transpose(-1, -2) @ values                            # (B, H, m, Ev)
            weights = key_classes.sum(dim=2)[..., None]                              # (B, H, m, 1)
            # A class no valid key belongs to (every assignment underflowed to 0) has a zero sum;
            # its summary is 0 rather than 0 / 0.
            summaries = sums / torch.where(weights > 0, weights, torch.ones_like(weights))
            out = (query_classes @ summaries).to(v.dtype)
        return zero_padded_queries(out, lengths)

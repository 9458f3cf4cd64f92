"""Linear attention (Katharopoulos et al. 2020, "Transformers are RNNs"; thesis chapter 4).

Softmax similarity exp(q . k) is replaced by phi(q) . phi(k) with phi(x) = elu(x) + 1, so the
sums over keys factor out of the per-query work:

    out_i = phi(q_i)^T (sum_j phi(k_j) v_j^T) / (phi(q_i)^T sum_j phi(k_j) + eps)

which costs O(N E^2) instead of O(N^2 E). Non-causal (every query sees every valid key).
Plain batched matmuls are already optimal for this (two GEMMs and a reduction), so there is
no kernel.
"""
import torch
import torch.nn.functional as F

from ..contract import (check_inputs, compute_dtype, valid_positions, zero_padded_queries,
                       zeros_without_valid_queries)
from ..registry import register_attention

# Added to the denominator, as in the authors' reference code: phi(x) = elu(x) + 1 > 0, but it
# underflows to 0 for very negative inputs, and 0 / 0 must not happen. Fixed, not an option.
EPS = 1e-6


class _FeatureMap(torch.autograd.Function):
    """phi(x) = elu(x) + 1 with the derivative min(phi(x), 1) (1 for x > 0, exp(x) = phi(x)
    otherwise), computed from the saved output: one fused op instead of torch's elu_backward,
    which took a third of the attention's time on the CPU."""

    @staticmethod
    def forward(ctx, x):
        out = F.elu(x).add_(1.0)
        ctx.save_for_backward(out)
        return out

    @staticmethod
    def backward(ctx, grad):
        out, = ctx.saved_tensors
        return grad * out.clamp(max=1.0)


def feature_map(x: torch.Tensor) -> torch.Tensor:
    """phi(x) = elu(x) + 1, positive everywhere."""
    return _FeatureMap.apply(x)


@register_attention("linear", summary="linear attention, phi(x) = elu(x) + 1 (Transformers are RNNs)",
                    compare_as="linear")
class LinearAttention(torch.nn.Module):
    """phi(Q) (phi(K)^T V) / (phi(Q) phi(K)^T 1 + eps) over the valid keys; no options."""

    def forward(self, q, k, v, lengths=None):
        padded = lengths is not None
        lengths = check_inputs(q, k, v, lengths, attention=self)
        if q.shape[0] == 0 or q.shape[2] == 0:
            return zeros_without_valid_queries(q, k, v)
        # Given lengths, padding is masked even in a batch without any (asking would cost a host
        # synchronisation); a batch whose every length is 0 comes out as zeros that way too.
        dtype = compute_dtype(q.dtype)
        with torch.autocast(device_type=q.device.type, enabled=False):
            phi_q, phi_k, values = feature_map(q.to(dtype)), feature_map(k.to(dtype)), v.to(dtype)
            if padded:
                mask = ~valid_positions(lengths, q.shape[2])[:, None, :, None]
                # masked_fill, not a product with the mask: a non-finite padded value is dropped
                # (and gives no NaN gradient through the padded rows).
                phi_q, phi_k = phi_q.masked_fill(mask, 0.0), phi_k.masked_fill(mask, 0.0)
                values = values.masked_fill(mask, 0.0)
            # A column of ones after the values makes the normaliser sum_j phi(k_j) the last
            # column of the key-value product: numerator and denominator in one matmul each way.
            values = torch.cat([values, values.new_ones(values.shape[:3] + (1,))], dim=3)
            key_values = phi_k.transpose(2, 3) @ values                       # (B, H, E, Ev + 1)
            both = phi_q @ key_values                                         # (B, H, N, Ev + 1)
            out = (both[..., :-1] / (both[..., -1:] + EPS)).to(v.dtype)
        return zero_padded_queries(out, lengths) if padded else out

"""Linear attention (Katharopoulos et al. 2020, "Transformers are RNNs"; thesis chapter 4).

Softmax similarity exp(q . k) is replaced by phi(q) . phi(k) with phi(x) = elu(x) + 1, so the
sums over keys factor out of the per-query work:

    out_i = phi(q_i)^T (sum_j phi(k_j) v_j^T) / (phi(q_i)^T sum_j phi(k_j) + eps)

which costs O(N E^2) instead of O(N^2 E). Non-causal (every query sees every valid key).

One autograd Function computes it over the sequence in chunks of CHUNK_POSITIONS positions: the
forward sums the key-value product KV = sum_j phi(k_j) [v_j, 1]^T over key chunks, then gives
each query chunk its output; the backward (derived by hand, see _ChunkedLinearAttention)
recomputes phi and the products chunk by chunk. Over several chunks only q, k, v, the padding
mask and KV (E x (Ev + 1) per head) are kept for the backward, so memory beyond the inputs,
outputs and gradients does not grow with N, and every elementwise pass works on one chunk that
stays in the CPU's caches instead of streaming N-long intermediates through memory. A sequence
of one chunk (every training utterance) keeps its phi(q), phi(k) and products instead of
recomputing them. torch.compile traces the whole sequence as one chunk. Plain batched matmuls
are already optimal for the per-chunk work, so there is no compiled kernel. No double backward.
Measurements: attention_ext/RESULTS.md.
"""
import torch
import torch.nn.functional as F

from ..contract import check_inputs, compute_dtype, valid_positions, zeros_without_valid_queries
from ..registry import register_attention

# Added to the denominator, as in the authors' reference code: phi(x) = elu(x) + 1 > 0, but it
# underflows to 0 for very negative inputs, and 0 / 0 must not happen. Fixed, not an option.
EPS = 1e-6

# Positions per chunk. At the long-recording shape (one sequence, 4 heads of 32 float32 channels)
# a chunk-sized tensor is 512 KiB and a pass holds two to four at a time: about a core's L2, where
# the whole sequence's (N, E)-sized intermediates left every cache. The chunk's tensors are also
# the only memory that does not grow with N (a few MiB), small beside the N-long output even at
# 16k positions. Larger chunks were no faster; smaller ones add Python overhead (about 40 ops
# per chunk, forward and backward). A chunk holds batch x heads x chunk rows, so a large batch
# of long sequences leaves the caches again; long recordings are attended one at a time.
# Training utterances of up to 1024 positions are one chunk. Read at every call, so a test can
# make it small.
CHUNK_POSITIONS = 1024


def _chunks(length: int, chunk_positions: int | None) -> list[slice]:
    """The chunks' position ranges; None: the whole sequence as one chunk."""
    if chunk_positions is None:
        return [slice(None)]
    return [slice(start, min(start + chunk_positions, length)) for start in range(0, length, chunk_positions)]


class _ChunkedLinearAttention(torch.autograd.Function):
    """out = phi(Q) KV[:, :Ev] / (phi(Q) KV[:, Ev] + eps), KV = phi(K)^T [V, 1], chunk by chunk.

    `padded` is None (no padding) or a (B, 1, N, 1) bool mask of the padded positions: their
    phi(q), phi(k) and v are set to 0 with masked_fill (so a non-finite padded value is dropped,
    not multiplied by 0), their output rows are 0 and their gradients are 0.

    The backward, derived by hand (per head; both_i = phi(q_i)^T KV is the row [num_i, den_i],
    out_i = num_i / (den_i + eps), g_i the output's gradient):
        grad_num_i = g_i / (den_i + eps)
        grad_den_i = -(g_i . out_i) / (den_i + eps) = -(g_i . num_i) / (den_i + eps)^2
        grad_phi(q_i) = grad_both_i KV^T                 grad_KV = sum_i phi(q_i) grad_both_i^T
        grad_phi(k_j) = grad_KV [v_j, 1]                 grad_v_j = (grad_KV^T phi(k_j))[:Ev]
        grad_x = grad_phi(x) * min(phi(x), 1)            (phi' = 1 for x > 0, exp(x) = phi(x) else)
    The first pass over query chunks gives grad_q and sums grad_KV, the second over key chunks
    gives grad_k and grad_v. A sequence of one chunk keeps its phi(q), phi(k) and [num, den]
    (no larger than a chunk's working set) instead of recomputing them. The backward is not
    itself differentiable (no double backward).
    """

    @staticmethod
    def forward(ctx, q, k, v, padded, chunk_positions):
        dtype = compute_dtype(q.dtype)
        batch, heads, length, dim = q.shape
        value_dim = v.shape[-1]
        chunks = _chunks(length, chunk_positions)
        key_values = torch.zeros(batch, heads, dim, value_dim, dtype=dtype, device=q.device)
        key_sum = torch.zeros(batch, heads, 1, dim, dtype=dtype, device=q.device)
        # Each chunk's work is a function call, so its temporaries are freed before the next
        # chunk allocates its own (a loop body's names would hold them one chunk longer).
        for rows in chunks:
            phi_k = _add_key_chunk(key_values, key_sum, k, v, padded, rows, dtype, keep=len(chunks) == 1)
        # The normaliser's sum as the last column: numerator and denominator in one matmul each way.
        key_values = torch.cat([key_values, key_sum.transpose(2, 3)], dim=3)   # (B, H, E, Ev + 1)
        out = torch.empty(batch, heads, length, value_dim, dtype=v.dtype, device=v.device)
        if len(chunks) == 1:   # kept for the backward: a chunk's worth, recomputing would cost more
            phi_q, both = _output_chunk(q, key_values, padded, chunks[0], out)
            ctx.save_for_backward(q, k, v, padded, key_values, phi_q, phi_k, both)
        else:
            for rows in chunks:
                _output_chunk(q, key_values, padded, rows, out)
            ctx.save_for_backward(q, k, v, padded, key_values, None, None, None)
        ctx.chunk_positions = chunk_positions
        return out

    @staticmethod
    def backward(ctx, grad_out):
        if torch.is_grad_enabled():   # create_graph=True: a graph of these gradients would be wrong
            raise RuntimeError("linear attention (attention_ext/attentions/linear.py) has no double backward (its "
                               "gradients are computed by hand): call backward without create_graph=True")
        q, k, v, padded, key_values, kept_phi_q, kept_phi_k, kept_both = ctx.saved_tensors
        need_q, need_k, need_v = ctx.needs_input_grad[:3]
        chunks = _chunks(q.shape[2], ctx.chunk_positions)
        grad_q = torch.empty_like(q) if need_q else None
        grad_key_values = torch.zeros_like(key_values) if need_k or need_v else None
        with torch.autocast(device_type=q.device.type, enabled=False):
            for rows in chunks:
                _query_chunk_backward(grad_out, q, key_values, padded, rows, kept_phi_q, kept_both,
                                      grad_q, grad_key_values)
            if grad_key_values is None:
                return grad_q, None, None, None, None
            grad_k = torch.empty_like(k) if need_k else None
            grad_v = torch.empty_like(v) if need_v else None
            for rows in chunks:
                _key_chunk_backward(grad_key_values, k, v, padded, rows, kept_phi_k, grad_k, grad_v)
        return grad_q, grad_k, grad_v, None, None


def _add_key_chunk(key_values, key_sum, k, v, padded, rows, dtype, keep):
    """Adds one key chunk's phi(k)^T v and sum of phi(k) to the sums; returns its phi(k) if `keep`."""
    phi_k = _feature_map(k[:, :, rows], dtype, padded, rows)
    key_values += phi_k.transpose(2, 3) @ _values(v[:, :, rows], dtype, padded, rows)
    key_sum += phi_k.sum(dim=2, keepdim=True)
    return phi_k if keep else None


def _query_chunk_backward(grad_out, q, key_values, padded, rows, kept_phi_q, kept_both, grad_q, grad_key_values):
    """The first backward pass on one query chunk: writes its grad_q (if wanted) and adds its
    phi(q)^T grad_both to grad_key_values (if given)."""
    dtype, value_dim = key_values.dtype, key_values.shape[-1] - 1
    if kept_both is None:
        phi_q, both = _output_chunk(q, key_values, padded, rows)
    else:
        phi_q, both = kept_phi_q, kept_both
    grad = grad_out[:, :, rows].to(dtype)
    if padded is not None:
        grad = grad.masked_fill(padded[:, :, rows], 0.0)
    numerator, denominator = both[..., :value_dim], both[..., value_dim:]   # den + eps
    grad_den = (grad * numerator).sum(dim=3, keepdim=True).div_(denominator).neg_()
    grad_both = torch.cat([grad, grad_den], dim=3).div_(denominator)
    if grad_key_values is not None:
        grad_key_values += phi_q.transpose(2, 3) @ grad_both
    if grad_q is not None:
        _through_feature_map(grad_both @ key_values.transpose(2, 3), phi_q, padded, rows, grad_q[:, :, rows])


def _key_chunk_backward(grad_key_values, k, v, padded, rows, kept_phi_k, grad_k, grad_v):
    """The second backward pass on one key chunk: writes its grad_k and grad_v (those given)."""
    dtype, value_dim = grad_key_values.dtype, grad_key_values.shape[-1] - 1
    grad_value_part = grad_key_values[..., :value_dim]                   # (B, H, E, Ev)
    phi_k = _feature_map(k[:, :, rows], dtype, padded, rows) if kept_phi_k is None else kept_phi_k
    if grad_v is not None:   # 0 at padded positions, where phi(k) is 0
        target = grad_v[:, :, rows]
        grad_values = torch.matmul(phi_k, grad_value_part, out=_into(target, dtype))
        if grad_values is not target:
            target.copy_(grad_values)
        del grad_values
    if grad_k is not None:
        grad_sum_part = grad_key_values[..., value_dim:].transpose(2, 3)     # (B, H, 1, E)
        grad_phi = torch.matmul(_values(v[:, :, rows], dtype, padded, rows),
                                grad_value_part.transpose(2, 3)).add_(grad_sum_part)
        _through_feature_map(grad_phi, phi_k, padded, rows, grad_k[:, :, rows])


def _feature_map(x, dtype, padded, rows):
    """phi(x) = elu(x) + 1 of one chunk in `dtype`, 0 at its padded positions (masked_fill: a
    non-finite padded x gives 0 too)."""
    phi = F.elu(x.to(dtype)).add_(1.0)
    return phi if padded is None else phi.masked_fill_(padded[:, :, rows], 0.0)


def _values(v, dtype, padded, rows):
    """One chunk of values in `dtype`, 0 at its padded positions."""
    v = v.to(dtype)
    return v if padded is None else v.masked_fill(padded[:, :, rows], 0.0)


def _output_chunk(q, key_values, padded, rows, out=None):
    """One query chunk's phi(q) and its product [num, den + eps] with KV; the output num / (den +
    eps) is written into out[:, :, rows] if `out` is given (0 in padded rows)."""
    phi_q = _feature_map(q[:, :, rows], key_values.dtype, padded, rows)
    value_dim = key_values.shape[-1] - 1
    both = phi_q @ key_values                                              # (B, H, chunk, Ev + 1)
    both[..., value_dim:] += EPS
    if out is not None:
        target = out[:, :, rows]
        result = torch.div(both[..., :value_dim], both[..., value_dim:], out=_into(target, both.dtype))
        if padded is not None:
            # 0 already unless KV holds an inf or NaN of a valid key (0 x inf): padded rows stay 0.
            result.masked_fill_(padded[:, :, rows], 0.0)
        if result is not target:
            target.copy_(result)
    return phi_q, both


def _into(destination, dtype):
    """`destination` (a slice of a result) to compute into directly when it has the compute dtype,
    else None (computed apart, then copied in with a cast). Always None under torch.compile, whose
    tracer takes no out= tensor that may be non-contiguous (the compiler fuses the copy)."""
    if torch.compiler.is_compiling() or destination.dtype != dtype:
        return None
    return destination


def _through_feature_map(grad_phi, phi, padded, rows, grad_x):
    """Writes grad_x = grad_phi(x) * phi'(x), phi'(x) = min(phi(x), 1), into the slice `grad_x`;
    0 at padded positions. phi is the masked one (0 where padded) and is not modified (it may be
    kept for another backward)."""
    result = torch.mul(grad_phi, phi.clamp(max=1.0), out=_into(grad_x, grad_phi.dtype))
    if padded is not None:
        result.masked_fill_(padded[:, :, rows], 0.0)
    if result is not grad_x:
        grad_x.copy_(result)


@register_attention("linear", summary="linear attention, phi(x) = elu(x) + 1 (Transformers are RNNs)",
                    compare_as="linear")
class LinearAttention(torch.nn.Module):
    """phi(Q) (phi(K)^T V) / (phi(Q) phi(K)^T 1 + eps) over the valid keys, computed in chunks of
    CHUNK_POSITIONS positions; no options."""

    def forward(self, q, k, v, lengths=None):
        padded = lengths is not None
        lengths = check_inputs(q, k, v, lengths, attention=self)
        if q.shape[0] == 0 or q.shape[2] == 0:
            return zeros_without_valid_queries(q, k, v)
        # Given lengths, padding is masked even in a batch without any (asking would cost a host
        # synchronisation); a batch whose every length is 0 comes out as zeros that way too.
        mask = ~valid_positions(lengths, q.shape[2])[:, None, :, None] if padded else None
        # Traced by torch.compile as one chunk: a loop over N / chunk would specialise the graph on
        # N (a recompilation for every new length under dynamic shapes).
        chunk_positions = None if torch.compiler.is_compiling() else CHUNK_POSITIONS
        with torch.autocast(device_type=q.device.type, enabled=False):
            return _ChunkedLinearAttention.apply(q, k, v, mask, chunk_positions)

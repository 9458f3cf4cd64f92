"""Table 1's evaluate-with rows on a shared-QK model, in the key form the model was trained with.

A model trained with shared_full or lsh learned the Reformer conventions (`attention_ext.attentions.shared_full`):
keys are the unit-normalised queries, and a query does not attend to its own key unless nothing else
is there. Run with plain full, clustered, i-clustered or oracle-top attention, the same model would
get keys equal to its raw queries and its own key allowed: another attention than the one it
learned. `build_in_reformer_form` builds those four in the model's own form:

    attn = build_in_reformer_form(parse_attention_spec("clustered-100"))
    out = attn(q, q, v, lengths)          # k must be q

    full        exactly shared_full (the same module)
    oracle_top  exact softmax over each query's top-k keys among those it may see (not its own)
    clustered   the queries clustered as by `clustered` (raw queries; centroid = mean of the members),
                the centroids scored against the unit keys; each query takes its cluster's softmax
                over the valid keys other than its own
    iclustered  as `iclustered` with unit keys: A^c over all valid keys, each cluster's top-k keys T_j
                and their mass m_j; query i of cluster j weighs key l by m_j softmax_{T_j}(q_i . k_l / sqrt(E))
                on T_j and by A^c_jl elsewhere, then its own key's weight is removed and the rest
                renormalised

Leaving a query's own key out of a row its cluster shares makes the rows per query, so clustered
and i-clustered are computed here densely, in blocks of queries, from plain torch ops and the
clustering and top-k of their own modules (quadratic, like oracle-top): they measure how well the
clustering approximates the model's attention, and their forward time says nothing about the
clustered kernels' speed. With at least as many clusters as positions each one is exactly
shared_full, as is i-clustered with topk >= the length and oracle-top with topk >= the length.
"""
from __future__ import annotations

import math

import torch

from ..contract import autocast_disabled, check_inputs, kernel_dtype, valid_positions, zero_padded_queries
from ..registry import AttentionConfigError, ValidatedAttention, available_attentions
from .clustered import ClusteredAttention, ClusterMean, cluster_queries, empty_attention
from .iclustered import ImprovedClusteredAttention, top_keys
from .oracle_top import OracleTopAttention, oracle_top_attention
from .shared_full import SharedFullAttention, unit_keys, visible_keys

# The attentions with a separate-key definition that have a Reformer form here.
REFORMER_FORMS = ("full", "oracle_top", "clustered", "iclustered")
# Scores computed at once per block of queries (elements), bounding peak memory for long sequences.
_ROW_BLOCK_ELEMENTS = 1 << 24


def runs_in_reformer_form(name: str) -> bool:
    """Whether attention `name` can run in the Reformer conventions: natively (those that need
    shared QK: shared_full, lsh) or through `build_in_reformer_form`."""
    return name in REFORMER_FORMS or available_attentions()[name].needs_shared_qk


def build_in_reformer_form(attention: ValidatedAttention) -> torch.nn.Module:
    """The module of `attention` in the Reformer conventions (see the module doc); an attention
    that needs shared QK is built as it is. AttentionConfigError for one without such a form."""
    if attention.needs_shared_qk:
        return attention.build()
    name, options = attention
    if name == "full":
        return SharedFullAttention()
    if name == "oracle_top":
        return ReformerOracleTopAttention(**options)
    if name == "clustered":
        return ReformerClusteredAttention(**options)
    if name == "iclustered":
        return ReformerImprovedClusteredAttention(**options)
    raise AttentionConfigError(f"attention '{name}' has no Reformer key form (unit keys, no attention to self); "
                               f"those with one: {', '.join(REFORMER_FORMS)}, and every attention that needs "
                               "shared QK")


class ReformerOracleTopAttention(OracleTopAttention):
    """oracle_top in the Reformer conventions: the top-k of each query's shared_full scores. Its
    options (and their defaults) are oracle_top's; only the forward differs."""
    attention_name, needs_shared_qk = "oracle_top (Reformer key form)", True

    def forward(self, q, k, v, lengths=None):
        lengths = check_inputs(q, k, v, lengths, attention=self)
        return oracle_top_attention(q, unit_keys(q), v, lengths, self.topk, exclude_self=True)


class ReformerClusteredAttention(ClusteredAttention):
    """clustered in the Reformer conventions (module doc); clustered's options, its own forward."""
    attention_name, needs_shared_qk = "clustered (Reformer key form)", True

    def forward(self, q, k, v, lengths=None):
        lengths = check_inputs(q, k, v, lengths, attention=self)
        return _clustered_rows(q, v, lengths, self.clusters, self.bits, self.iterations, topk=None)


class ReformerImprovedClusteredAttention(ImprovedClusteredAttention):
    """iclustered in the Reformer conventions (module doc); iclustered's options, its own forward."""
    attention_name, needs_shared_qk = "iclustered (Reformer key form)", True

    def forward(self, q, k, v, lengths=None):
        lengths = check_inputs(q, k, v, lengths, attention=self)
        return _clustered_rows(q, v, lengths, self.clusters, self.bits, self.iterations, topk=self.topk)


def _finite_or_zero(x: torch.Tensor) -> torch.Tensor:
    return torch.where(torch.isfinite(x), x, torch.zeros_like(x))


def _clustered_rows(q: torch.Tensor, v: torch.Tensor, lengths: torch.Tensor, clusters: int, bits: int,
                    iterations: int, topk: int | None) -> torch.Tensor:
    """Clustered (topk None) or i-clustered attention with unit keys, each query's row without its
    own key. Rows are logits, so a sharp attention loses no precision: on T_j the logit of key l is
    q_i . k_l / sqrt(E) + log(m_j Z_j) - logsumexp_{T_j}(q_i . k / sqrt(E)), elsewhere the centroid's
    score, Z_j being the centroid's softmax normaliser (common to the row, so it cancels)."""
    if q.numel() == 0 or v.numel() == 0:
        return empty_attention(q, q, v)
    with autocast_disabled(q.device):
        input_dtype = q.dtype
        dtype = kernel_dtype(q.dtype, q.device)
        q, v = q.to(dtype), v.to(dtype)
        batch, heads, length, dim = q.shape
        keys = unit_keys(q)
        scale = 1.0 / math.sqrt(dim)
        grouping = cluster_queries(q, lengths, clusters, bits, iterations)
        key_valid = valid_positions(lengths.clamp(min=1), length)[:, None, None, :]
        centroid_scores = torch.matmul(ClusterMean.apply(q, grouping) * scale, keys.transpose(-1, -2))
        centroid_scores = centroid_scores.masked_fill(~key_valid, float("-inf"))      # (B, H, C, N)
        if topk is not None:
            top = top_keys(torch.softmax(centroid_scores, dim=-1), lengths, topk)     # (B, H, C, S); -1: none
            present = top >= 0
            # a -1 slot points at slot 0's key and writes slot 0's value, so no two writes disagree
            index = torch.where(present, top, top[..., :1].clamp(min=0))
            in_top = torch.zeros_like(centroid_scores, dtype=torch.bool).scatter_(
                -1, index, present[..., :1].expand_as(index))
            log_top_mass = torch.logsumexp(centroid_scores.masked_fill(~in_top, float("-inf")), dim=-1)
        cluster_of = grouping.assignment.clamp(min=0)    # padded queries read cluster 0; zeroed below
        visible = visible_keys(lengths, length)[:, None]                                  # (B, 1, N, N)
        block = max(1, _ROW_BLOCK_ELEMENTS // max(1, batch * heads * length))
        outputs = []
        for start in range(0, length, block):
            members = cluster_of[:, :, start:start + block]                               # (B, H, n)
            index = members[..., None].expand(-1, -1, -1, length)
            rows = centroid_scores.gather(2, index)                                       # (B, H, n, N)
            if topk is not None:
                own_top = in_top.gather(2, index)
                dots = torch.matmul(q[:, :, start:start + block] * scale, keys.transpose(-1, -2))
                log_dots_top = torch.logsumexp(dots.masked_fill(~own_top, float("-inf")), dim=-1, keepdim=True)
                shift = _finite_or_zero(log_top_mass.gather(2, members)[..., None]) - _finite_or_zero(log_dots_top)
                rows = torch.where(own_top, dots + shift, rows)
            rows = rows.masked_fill(~visible[:, :, start:start + block], float("-inf"))
            outputs.append(torch.softmax(rows, dim=-1) @ v)
        out = outputs[0] if len(outputs) == 1 else torch.cat(outputs, dim=2)
        return zero_padded_queries(out, lengths).to(input_dtype)

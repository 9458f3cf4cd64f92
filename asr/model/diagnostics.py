"""Training diagnostics: per-layer gradient norms, query norms and attention entropy; and the
per-layer measures of a trained model's attention the sharpening curve takes (entropy, locality,
the time spread of query clusters: layer_attention_measures, recipes/synth/sharpening.py).

    python -m asr.train conf=synth_shared_full trainer.diagnostics_every_n_steps=10

writes, every N training steps, one row of <run folder>/diagnostics.csv:

    step, loss                     the training step and its loss
    grad_norm/<part>               L2 norm of the gradient of each part (frontend, layer0 ...,
                                   heads), before clipping
    query_norm/layer<i>            mean L2 norm of one head's query vector
    entropy/layer<i>               mean entropy of the exact attention distribution of each valid
                                   query, divided by log(number of keys it can see): 1 is uniform
                                   (the layer averages), 0 is one key

The entropy is that of the exact attention the model's projections define, whatever attention
the run trains with: softmax(q k^T / sqrt(E)) over the valid keys, or, for a shared-QK model,
the Reformer form of attention_ext's shared_full (unit-normalised keys, no attention to self).
It is what tells whether attention is flat (a model that has not learned where to look) or
peaked. Written for the shared-QK plateau diagnosis in asr/RESULTS.md.
"""
from __future__ import annotations

import csv
import math
from pathlib import Path

import torch
import torch.nn.functional as F
from lightning.pytorch.callbacks import Callback


def exact_attention(q: torch.Tensor, k: torch.Tensor, lengths: torch.Tensor, shared_qk: bool
                    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """The exact attention the projections define, softmax(q k^T / sqrt(E)) over the valid keys
    (with shared_qk: over the unit keys q / ||q||, no attention to self, as attention_ext.attentions.shared_full).

    Returns (log_p, visible, counted, seen): (B, H, N, N) log-probabilities, (B, H, N, N) bool of
    the keys each query sees, (B, H, N) bool of the queries that count (valid ones that see more
    than one key; the rows of the others are a placeholder), (B, H, N) number of keys seen.
    """
    batch, heads, length, dim = q.shape
    valid = torch.arange(length, device=q.device) < lengths[:, None]           # (B, N)
    keys = F.normalize(q, dim=-1) if shared_qk else k
    logits = q.float() @ keys.float().transpose(-1, -2) / math.sqrt(dim)       # (B, H, N, N)
    visible = valid[:, None, None, :].expand(batch, heads, length, length).clone()
    if shared_qk:
        visible &= ~torch.eye(length, dtype=torch.bool, device=q.device)
    logits = logits.masked_fill(~visible, float("-inf"))
    seen = visible.sum(-1)                                                    # (B, H, N)
    counted = valid[:, None, :] & (seen > 1)
    log_p = torch.log_softmax(logits.masked_fill(~counted[..., None], 0.0), dim=-1)
    return log_p, visible, counted, seen


def attention_weights(exact: tuple) -> torch.Tensor:
    """The (B, H, N, N) weights of exact_attention's result, 0 on the keys a query does not see."""
    log_p, visible, _, _ = exact
    return log_p.exp().masked_fill(~visible, 0.0)


def relative_attention_entropy(q: torch.Tensor, k: torch.Tensor, lengths: torch.Tensor, shared_qk: bool,
                               exact: tuple | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """(B, H, N) entropy / log(keys seen) of each query's exact attention (exact_attention), and the
    (B, H, N) bool of the queries that count: valid ones that see more than one key.

    q, k: (B, H, N, E); lengths: (B,). With shared_qk the keys are q / ||q|| and a query does
    not see its own key (as attention_ext.attentions.shared_full). exact: exact_attention's result
    for these inputs when the caller has it already (this and the next measures share one).
    """
    log_p, visible, counted, seen = exact or exact_attention(q, k, lengths, shared_qk)
    p = log_p.exp()
    entropy = -(p * log_p.masked_fill(~visible, 0.0)).sum(-1)                # (B, H, N)
    return entropy / torch.log(seen.clamp(min=2).float()), counted


def attention_entropy(q: torch.Tensor, k: torch.Tensor, lengths: torch.Tensor, shared_qk: bool
                      ) -> torch.Tensor:
    """Mean relative entropy (entropy / log(keys seen)) of exact attention over valid queries
    (relative_attention_entropy); queries that see a single key are left out."""
    relative, counted = relative_attention_entropy(q, k, lengths, shared_qk)
    if not counted.any():
        return torch.tensor(float("nan"))
    return relative[counted].mean()


def attention_locality(q: torch.Tensor, k: torch.Tensor, lengths: torch.Tensor, shared_qk: bool,
                       radii: tuple[int, ...], exact: tuple | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """(len(radii), B, H, N) share of each query's exact attention mass (exact_attention) on the keys
    within +-radius positions of it (itself included), and the (B, H, N) bool of the queries that
    count (as for the entropy). exact: as for relative_attention_entropy."""
    exact = exact or exact_attention(q, k, lengths, shared_qk)
    p, counted = attention_weights(exact), exact[2]
    position = torch.arange(q.shape[2], device=q.device)
    distance = (position[:, None] - position[None, :]).abs()                   # (N, N)
    return torch.stack([(p * (distance <= radius)).sum(-1) for radius in radii]), counted


def query_similarity(q: torch.Tensor, lengths: torch.Tensor) -> tuple[float, int]:
    """How alike the queries of different positions are: per sequence and head, the mean cosine
    similarity over the pairs of distinct positions i != j < length, summed over sequences and heads,
    and the number of (sequence, head) pairs summed (those with at least two positions), for an exact
    mean over batches. Near 1, every position asks the same question (states collapsed towards one
    vector, as a post-norm encoder stuck at CTC's all-blank output); near 0, unrelated queries.
    q: (B, H, N, E); lengths: (B,). With u the unit queries, sum_{i != j} u_i.u_j = |sum_i u_i|^2 - n."""
    valid = torch.arange(q.shape[2], device=q.device)[None, :] < lengths[:, None]            # (B, N)
    unit = torch.nn.functional.normalize(q.double(), dim=-1).masked_fill(~valid[:, None, :, None], 0.0)
    n = lengths.double()[:, None].expand(-1, q.shape[1])                                   # (B, H)
    pairs = n * (n - 1)
    counted = pairs > 0
    mean = (unit.sum(2).pow(2).sum(-1) - n) / pairs.clamp(min=1)
    return float(mean[counted].sum()), int(counted.sum())


def per_cluster_sum(values: torch.Tensor, assignment: torch.Tensor) -> torch.Tensor:
    """(B, H, C, ...) sum over each cluster's queries of values (B, H, N, ...), C the number of
    cluster ids in assignment (B, H, N): cluster id of each query, -1 for padded ones, which add nothing."""
    member = assignment >= 0
    slots = int(assignment.max()) + 1 if member.any() else 1
    per_query = assignment.shape + (1,) * (values.dim() - 3)                    # broadcast over values' trailing dims
    masked = values.masked_fill(~member.reshape(per_query), 0.0)
    index = assignment.clamp(min=0).reshape(per_query).expand_as(values)
    return values.new_zeros(*assignment.shape[:2], slots, *values.shape[3:]).scatter_add_(2, index, masked)


def cluster_time_spread(assignment: torch.Tensor, lengths: torch.Tensor) -> tuple[float, float, int]:
    """How far apart in time the queries of each cluster are, summed for an exact mean over batches.

    assignment: (B, H, N) cluster id of each query, -1 for padded ones (attention_ext.attentions.clustered's
    QueryClusters.assignment); lengths: (B,). A cluster's spread is the standard deviation
    (population, 1/n) of its members' positions. Returns (sum over clusters of members x spread in
    positions, the same with each spread divided by its sequence's length, number of queries): the
    ratios are the mean spread weighted by cluster size, i.e. the mean over queries of the spread of
    the query's cluster. A cluster of queries spread evenly over a sequence of length L has a spread
    of about L / sqrt(12) = 0.29 L; queries alone in their cluster have 0.
    """
    batch, heads, length = assignment.shape
    position = torch.arange(length, dtype=torch.float64, device=assignment.device).expand(batch, heads, length)
    counts = per_cluster_sum(torch.ones_like(position), assignment)
    mean = per_cluster_sum(position, assignment) / counts.clamp(min=1)
    variance = (per_cluster_sum(position * position, assignment) / counts.clamp(min=1) - mean * mean).clamp(min=0.0)
    weighted = counts * variance.sqrt()                                          # (B, H, C)
    return (float(weighted.sum()), float((weighted.sum((1, 2)) / lengths.double().clamp(min=1)).sum()),
            int(counts.sum()))


def centroid_weights(q: torch.Tensor, k: torch.Tensor, lengths: torch.Tensor, shared_qk: bool,
                     assignment: torch.Tensor, exact: tuple | None = None
                     ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Each query's exact attention (exact_attention) and the attention clustered attention gives it,
    its cluster centroid's, the centroid being the mean of the cluster's queries (the paper's eq. 3-5):
    (B, H, N, N) weights each (0 on the keys a query does not see), and the (B, H, N) bool of the
    queries that count.

    assignment: (B, H, N) cluster id of each query, -1 for padded ones (QueryClusters.assignment).
    The centroid's weights are over the keys the query sees (with shared_qk, its own key left out).
    exact: as for relative_attention_entropy."""
    exact = exact or exact_attention(q, k, lengths, shared_qk)
    _, visible, counted, _ = exact
    dim = q.shape[-1]
    sums = per_cluster_sum(q.float(), assignment)                                # (B, H, C, E)
    counts = per_cluster_sum(torch.ones_like(assignment, dtype=torch.float32), assignment)
    index = assignment.clamp(min=0)[..., None].expand(-1, -1, -1, dim)          # (B, H, N, E)
    centroid = (sums / counts.clamp(min=1)[..., None]).gather(2, index)          # per query
    keys = F.normalize(q, dim=-1) if shared_qk else k
    logits = (centroid @ keys.float().transpose(-1, -2) / math.sqrt(dim)).masked_fill(~visible, float("-inf"))
    shared = torch.softmax(logits.masked_fill(~counted[..., None], 0.0), dim=-1).masked_fill(~visible, 0.0)
    return attention_weights(exact), shared, counted


def clustering_error(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, lengths: torch.Tensor, shared_qk: bool,
                     assignment: torch.Tensor, exact: tuple | None = None) -> dict[str, tuple[float, int]]:
    """How much clustered attention changes each query's attention (centroid_weights), as (sum over the
    queries that count, their number) for an exact mean over batches:

        weights   the total variation distance (half the L1 distance) between the query's exact weights
                  and its centroid's: 0 when clustering changes no weight, 1 when disjoint
        output    the norm of the difference of the two outputs (weights x v) divided by the norm of
                  the exact output: how far the attention's output moves, which stays small when the
                  weight moves to keys whose values are alike

    v: (B, H, N, D) the layer's values. exact: as for relative_attention_entropy."""
    exact_weights, shared, counted = centroid_weights(q, k, lengths, shared_qk, assignment, exact)
    values = v.float()
    return weight_and_output_errors(exact_weights, shared, counted, exact_weights @ values, shared @ values)


def weight_and_output_errors(exact_weights: torch.Tensor, shared: torch.Tensor, counted: torch.Tensor,
                             output: torch.Tensor, clustered: torch.Tensor) -> dict[str, tuple[float, int]]:
    """clustering_error from centroid_weights' result and the (B, H, N, D) outputs of both weights."""
    weights = 0.5 * (exact_weights - shared).abs().sum(-1)                        # (B, H, N)
    moved = (clustered - output).norm(dim=-1) / output.norm(dim=-1).clamp(min=1e-12)
    count = int(counted.sum())
    return {"weights": (float(weights[counted].sum()), count), "output": (float(moved[counted].sum()), count)}


def relative_change(before: torch.Tensor, after: torch.Tensor, lengths: torch.Tensor) -> tuple[float, int]:
    """(sum over the valid positions of |after - before| / |before|, their number): (B, N, D) tensors,
    the norms over D, positions from each sequence's length on left out."""
    valid = torch.arange(before.shape[1], device=lengths.device)[None, :] < lengths[:, None]
    change = (after.float() - before.float()).norm(dim=-1) / before.float().norm(dim=-1).clamp(min=1e-12)
    return float(change[valid].sum()), int(valid.sum())


@torch.no_grad()
def layer_attention_inputs(model, features: torch.Tensor, lengths: torch.Tensor
                           ) -> list[tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]]:
    """(q, k, v, lengths) that each encoder layer's attention of `model` (a SpeechRecognizer) receives in
    one forward pass with its current attentions: what the attention sees, whatever the layer form,
    positions or key sharing."""
    return [attention_inputs for attention_inputs, _ in layer_inputs(model, features, lengths)]


@torch.no_grad()
def layer_inputs(model, features: torch.Tensor, lengths: torch.Tensor) -> list[tuple[tuple, torch.Tensor]]:
    """Per encoder layer of `model`, in one forward pass with its current attentions: ((q, k, v, lengths)
    as layer_attention_inputs, the layer's own (B, N, D) input)."""
    attention_inputs: dict[int, tuple] = {}
    layer_input: dict[int, torch.Tensor] = {}
    hooks = []
    for index, layer in enumerate(model.encoder.layers):
        hooks.append(layer.attention.register_forward_pre_hook(
            lambda module, args, index=index: attention_inputs.__setitem__(index, args[:4])))
        hooks.append(layer.register_forward_pre_hook(
            lambda module, args, index=index: layer_input.__setitem__(index, args[0])))
    try:
        model(features, lengths)
    finally:
        for hook in hooks:
            hook.remove()
    return [(attention_inputs[index], layer_input[index]) for index in range(len(model.encoder.layers))]


LOCALITY_RADII = (5, 20)


@torch.no_grad()
def layer_attention_measures(model, features: torch.Tensor, lengths: torch.Tensor,
                             clustering: dict | None = None, reseed=None) -> list[dict[str, tuple[float, int]]]:
    """Per encoder layer of `model` on one batch, each measure as (sum, count) so that a mean over many
    batches is exact (the layers' inputs are those of a forward pass with the model's current attentions):

        entropy                    relative entropy of exact attention (relative_attention_entropy)
        locality5, locality20      share of exact attention within +-5 / +-20 positions (attention_locality)
        query_similarity           mean cosine between the queries of two positions (query_similarity)
        attention_share            the norm of what exact attention adds to the residual stream
                                   (EncoderLayer.attention_update) over the norm of the layer's input,
                                   per position: how much the layer's output is the attention's at all
        cluster_spread             with `clustering` ({clusters, bits, iterations} of clustered or
        cluster_spread_fraction    i-clustered attention): the queries' clusters by the attention's own
                                   attention_ext.attentions.clustered.cluster_queries, their time spread in positions
                                   and as a share of the sequence length (cluster_time_spread)
        clustering_error           with `clustering`: the total variation between each query's exact
        clustering_output_error    attention and its cluster centroid's (what clustered attention gives
                                   it), and the relative change of its output (clustering_error)
        clustering_layer_error     with `clustering`: the relative change of the layer's output, per
                                   position, when its attention output is the clustered one (each query
                                   its centroid's weights) instead of the exact one, its input the same:
                                   what of the attention's output error gets through the residual, the
                                   feed-forward block and the norms to the next layer

    reseed() is called before each layer's clustering: with the seed of the batch (as an evaluation
    seeds it), a layer's clusters are those that attention computes when it runs in that layer alone
    behind exact layers (which draw nothing)."""
    from attention_ext.attentions.clustered import cluster_queries
    from attention_ext.contract import kernel_dtype
    shared_qk = model.encoder.shared_qk
    measures = []
    for layer_module, ((q, k, v, layer_lengths), x) in zip(model.encoder.layers, layer_inputs(model, features, lengths)):
        exact = exact_attention(q, k, layer_lengths, shared_qk)        # one (B, H, N, N) softmax per layer
        relative, counted = relative_attention_entropy(q, k, layer_lengths, shared_qk, exact)
        shares, _ = attention_locality(q, k, layer_lengths, shared_qk, LOCALITY_RADII, exact)
        count = int(counted.sum())
        values = v.float()
        output = attention_weights(exact) @ values                      # exact attention's (B, H, N, D)
        update = layer_module.attention_update(output.to(x.dtype))
        layer = {"entropy": (float(relative[counted].sum()), count),
                 **{f"locality{radius}": (float(share[counted].sum()), count)
                    for radius, share in zip(LOCALITY_RADII, shares)},
                 "query_similarity": query_similarity(q, layer_lengths),
                 "attention_share": relative_change(x, x + update, layer_lengths)}
        if clustering is not None:
            if reseed is not None:
                reseed()
            clusters = cluster_queries(q.to(kernel_dtype(q.dtype, q.device)), layer_lengths, clustering["clusters"], clustering["bits"],
                                       clustering["iterations"])
            spread, fraction, queries = cluster_time_spread(clusters.assignment, layer_lengths)
            exact_weights, shared, _ = centroid_weights(q, k, layer_lengths, shared_qk, clusters.assignment, exact)
            clustered = shared @ values
            errors = weight_and_output_errors(exact_weights, shared, counted, output, clustered)
            layer_output = layer_module.feed_forward_stage(x + update)
            clustered_output = layer_module.feed_forward_stage(x + layer_module.attention_update(clustered.to(x.dtype)))
            layer.update(cluster_spread=(spread, queries), cluster_spread_fraction=(fraction, queries),
                         clustering_error=errors["weights"], clustering_output_error=errors["output"],
                         clustering_layer_error=relative_change(layer_output, clustered_output, layer_lengths))
        measures.append(layer)
    return measures


class TrainingDiagnostics(Callback):
    """Writes gradient norms, query norms and attention entropy every `every_n_steps` steps to
    `path` (a CSV file; appended to, so a resumed run continues it)."""

    def __init__(self, every_n_steps: int, path: Path):
        self.every_n_steps, self.path = every_n_steps, Path(path)
        self._layer_inputs: dict[int, tuple] = {}
        self._hooks = []
        self._row: dict[str, float] = {}

    def _due(self, trainer) -> bool:
        return trainer.global_step % self.every_n_steps == 0

    def on_train_batch_start(self, trainer, module, batch, batch_index) -> None:
        if not self._due(trainer):
            return
        for index, layer in enumerate(module.encoder.layers):
            def keep(layer_module, args, index=index):   # (x, lengths, rotary positions or None)
                self._layer_inputs[index] = tuple(arg if arg is None or isinstance(arg, tuple) else arg.detach()
                                                  for arg in args)
            self._hooks.append(layer.register_forward_pre_hook(keep))

    def on_before_optimizer_step(self, trainer, module, optimizer) -> None:
        if not self._due(trainer):
            return
        parts = {"frontend": module.encoder.frontend, "heads": module.heads,
                 **{f"layer{i}": layer for i, layer in enumerate(module.encoder.layers)}}
        for name, part in parts.items():
            grads = [p.grad.detach().float().norm() for p in part.parameters() if p.grad is not None]
            if grads:
                self._row[f"grad_norm/{name}"] = float(torch.stack(grads).norm())

    @torch.no_grad()
    def on_train_batch_end(self, trainer, module, outputs, batch, batch_index) -> None:
        for hook in self._hooks:
            hook.remove()
        self._hooks.clear()
        if not self._layer_inputs or trainer.global_rank != 0:
            self._layer_inputs.clear()
            return
        loss = outputs["loss"] if isinstance(outputs, dict) else outputs
        row = {"step": trainer.global_step - 1, "loss": float(loss), **self._row}
        for index, layer in enumerate(module.encoder.layers):
            x, lengths, *rotary = self._layer_inputs[index]
            q, k = layer.queries_and_keys(layer.attention_input(x), *rotary)
            valid = (torch.arange(q.shape[2], device=q.device) < lengths[:, None])[:, None, :]
            row[f"query_norm/layer{index}"] = float(q.norm(dim=-1)[valid.expand(q.shape[:3])].mean())
            row[f"entropy/layer{index}"] = float(attention_entropy(q, k, lengths, layer.shared_qk))
        self._layer_inputs.clear()
        self._row = {}
        new_file = not self.path.is_file()
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.path, "a", newline="") as handle:
            writer = csv.DictWriter(handle, fieldnames=list(row))
            if new_file:
                writer.writeheader()
            writer.writerow(row)

"""Training diagnostics: per-layer gradient norms, query norms and attention entropy.

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


def relative_attention_entropy(q: torch.Tensor, k: torch.Tensor, lengths: torch.Tensor, shared_qk: bool
                               ) -> tuple[torch.Tensor, torch.Tensor]:
    """(B, H, N) entropy / log(keys seen) of each query's exact attention, and the (B, H, N) bool
    of the queries that count: valid ones that see more than one key.

    q, k: (B, H, N, E); lengths: (B,). With shared_qk the keys are q / ||q|| and a query does
    not see its own key (as attention_ext.attentions.shared_full).
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


@torch.no_grad()
def layer_attention_entropy(model, features: torch.Tensor, lengths: torch.Tensor) -> list[tuple[float, int]]:
    """Per encoder layer of `model` (a SpeechRecognizer) on one batch: (sum of the queries' relative
    entropies, number of queries counted), so that a mean over many batches is exact. The layers'
    inputs are those of the model's forward pass with its current attention."""
    inputs: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}
    hooks = [layer.register_forward_pre_hook(lambda module, args, index=index: inputs.__setitem__(index, args))
             for index, layer in enumerate(model.encoder.layers)]
    try:
        model(features, lengths)
    finally:
        for hook in hooks:
            hook.remove()
    sums = []
    for index, layer in enumerate(model.encoder.layers):
        x, layer_lengths, *rotary = inputs[index]        # (x, lengths, rotary positions or None)
        q, k = layer.queries_and_keys(layer.attention_norm(x), *rotary)
        relative, counted = relative_attention_entropy(q, k, layer_lengths, layer.shared_qk)
        sums.append((float(relative[counted].sum()), int(counted.sum())))
    return sums


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
            q, k = layer.queries_and_keys(layer.attention_norm(x), *rotary)
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

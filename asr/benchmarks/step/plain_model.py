"""The toolkit's CTC model written plainly in PyTorch: the yardstick of the training-step benchmark.

    plain = PlainRecognizer(feature_dim=40, vocab_sizes={"phones": 40, "chars": 29}, layers=6, heads=4,
                            head_dim=32, ff_dim=512, dropout=0.1, subsampling=2, subsampling_channels=32)
    log_probs, lengths = plain(features, feature_lengths)      # {kind: (B, T', V)}, (B,)
    plain.load_state_dict(plain_state_dict(recognizer.state_dict()))   # the toolkit model's weights

The same architecture as asr.model (SpeechRecognizer: feature normalisation, ConvSubsampling,
sinusoidal positions, pre-norm encoder layers, a final LayerNorm, one linear CTC head per target
kind), with the parameter count of a full-attention toolkit model, but built from torch's own
layers with nothing of ours: `nn.TransformerEncoderLayer(norm_first=True)` (whose attention is
`nn.MultiheadAttention`, i.e. SDPA with a key-padding mask) and ordinary (B, C, T, F) convolutions.
What the toolkit adds on top of this is what the benchmark measures.

Two things make it compute exactly what the toolkit model computes (tests/asr/test_step_benchmark.py
checks it, weights loaded from a toolkit model):
- `nn.MultiheadAttention` drops attention weights with the layer's dropout; the toolkit has no
  dropout on attention weights (only after the output projection and in the feed-forward block),
  so it is set to 0. It would also make CPU SDPA leave its fused kernel.
- Padded frames are zeroed before every convolution, as in the toolkit, so a sequence gives the
  same output alone as inside a padded batch.
It differs only on padded positions, which nothing reads: the toolkit zeroes padded query rows of
every attention, torch lets them attend. A sequence must have at least one frame (a fully masked
key row is NaN in nn.MultiheadAttention).
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn


def _frames_mask(lengths: torch.Tensor, frames: int) -> torch.Tensor:
    return torch.arange(frames, device=lengths.device)[None, :] < lengths[:, None]   # (B, T) True inside


# The stride of each convolution per subsampling factor (the same stride over time and frequency):
# factor 2 is two convolutions of strides 2 and 1, factor 4 two of stride 2, as in ESPnet and the toolkit.
STRIDES = {1: (), 2: (2, 1), 4: (2, 2)}


class PlainFrontEnd(nn.Module):
    """Subsampling by 1 (a linear projection), 2 or 4 (two 3x3 convolutions + ReLU over (time,
    frequency), padding 1, strides STRIDES), then a linear projection to the model width."""

    def __init__(self, feature_dim: int, d_model: int, factor: int, channels: int):
        super().__init__()
        self.strides = STRIDES[factor]
        self.convs = nn.ModuleList(nn.Conv2d(1 if i == 0 else channels, channels, 3, stride=stride, padding=1)
                                   for i, stride in enumerate(self.strides))
        freq = feature_dim
        for stride in self.strides:
            freq = (freq - 1) // stride + 1
        self.projection = nn.Linear((channels if self.strides else 1) * freq, d_model)

    def output_lengths(self, lengths: torch.Tensor) -> torch.Tensor:
        for stride in self.strides:
            lengths = (lengths - 1) // stride + 1
        return lengths

    def forward(self, x: torch.Tensor, lengths: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        x = x.unsqueeze(1)                                             # (B, 1, T, F)
        for conv, stride in zip(self.convs, self.strides):
            x = x * _frames_mask(lengths, x.shape[2])[:, None, :, None]
            x = F.relu(conv(x))
            lengths = (lengths - 1) // stride + 1
        batch, channels, time, freq = x.shape
        return self.projection(x.transpose(1, 2).reshape(batch, time, channels * freq)), lengths


def sinusoids(length: int, d_model: int, device=None) -> torch.Tensor:
    """(length, d_model): sin(pos / 10000^(2i/d)) on even dims, cos on odd ones (Vaswani et al.)."""
    position = torch.arange(length, device=device, dtype=torch.float32)[:, None]
    inverse = torch.exp(torch.arange(0, d_model, 2, device=device, dtype=torch.float32) * (-math.log(10000.0) / d_model))
    table = torch.empty(length, d_model, device=device)
    table[:, 0::2] = torch.sin(position * inverse)
    table[:, 1::2] = torch.cos(position * inverse)
    return table


class PlainRecognizer(nn.Module):
    """Raw features (B, T, F) and frame counts -> {kind: (B, T', V) log-probabilities}, lengths T'."""

    def __init__(self, feature_dim: int, vocab_sizes: dict[str, int], *, layers: int, heads: int, head_dim: int,
                 ff_dim: int, dropout: float, subsampling: int, subsampling_channels: int):
        super().__init__()
        d_model = heads * head_dim
        self.d_model = d_model
        self.register_buffer("feature_mean", torch.zeros(feature_dim))
        self.register_buffer("feature_std", torch.ones(feature_dim))
        self.frontend = PlainFrontEnd(feature_dim, d_model, subsampling, subsampling_channels)
        self.input_dropout = nn.Dropout(dropout)
        self.layers = nn.ModuleList()
        for _ in range(layers):
            layer = nn.TransformerEncoderLayer(d_model, heads, ff_dim, dropout, activation="relu",
                                               batch_first=True, norm_first=True)
            layer.self_attn.dropout = 0.0   # no dropout on attention weights, as in the toolkit (docstring)
            self.layers.append(layer)
        self.final_norm = nn.LayerNorm(d_model)
        self.heads = nn.ModuleDict({kind: nn.Linear(d_model, size) for kind, size in vocab_sizes.items()})

    def forward(self, features: torch.Tensor, lengths: torch.Tensor) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
        features = (features - self.feature_mean) / self.feature_std
        features = features * _frames_mask(lengths, features.shape[1])[..., None]
        states, lengths = self.encode(features, lengths)
        return self.ctc_log_probs(states), lengths

    def encode(self, features: torch.Tensor, lengths: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Normalised features -> (B, T', D) encoder states, lengths T': the part the toolkit's
        TransformerEncoder computes (what the step benchmark compiles or graphs in both)."""
        x, lengths = self.frontend(features, lengths)
        x = x * math.sqrt(self.d_model) + sinusoids(x.shape[1], self.d_model, x.device)
        x = self.input_dropout(x)
        padding = ~_frames_mask(lengths, x.shape[1])
        for layer in self.layers:
            x = layer(x, src_key_padding_mask=padding)
        return self.final_norm(x), lengths

    def ctc_log_probs(self, states: torch.Tensor) -> dict[str, torch.Tensor]:
        """(B, T', D) encoder states -> {kind: (B, T', V) log-probabilities}."""
        return {kind: F.log_softmax(head(states).float(), dim=-1) for kind, head in self.heads.items()}


def plain_state_dict(toolkit_state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """A toolkit SpeechRecognizer's state dict (separate query/key/value projections) as a
    PlainRecognizer's (nn.MultiheadAttention's packed in_proj = [query; key; value])."""
    state = {}
    layer_parts = {"attention_norm": "norm1", "output": "self_attn.out_proj", "ff_norm": "norm2",
                   "ff.0": "linear1", "ff.3": "linear2"}
    for name, tensor in toolkit_state.items():
        if name.startswith("encoder.layers."):
            index, rest = name[len("encoder.layers."):].split(".", 1)
            part, field = rest.rsplit(".", 1)
            if part in ("query", "key", "value"):
                continue   # packed below
            state[f"layers.{index}.{layer_parts[part]}.{field}"] = tensor
        elif name.startswith("encoder."):
            state[name[len("encoder."):]] = tensor                   # frontend.*, final_norm.*
        elif name.startswith("heads.projections."):
            state["heads." + name[len("heads.projections."):]] = tensor
        else:
            state[name] = tensor                                      # feature_mean, feature_std
    layers = {name.split(".")[2] for name in toolkit_state if name.startswith("encoder.layers.")}
    for index in layers:
        if f"encoder.layers.{index}.key.weight" not in toolkit_state:
            raise ValueError("a shared-QK toolkit model (model.shared_qk=true) has no separate key projection; "
                             "the plain model has one, so it can only take the weights of a model without it")
        for field in ("weight", "bias"):
            state[f"layers.{index}.self_attn.in_proj_{field}"] = torch.cat(
                [toolkit_state[f"encoder.layers.{index}.{part}.{field}"] for part in ("query", "key", "value")])
    return state

"""The CTC transformer encoder: subsampling front end, positions, pre-norm or post-norm layers.

    encoder = TransformerEncoder(feature_dim=40, layers=9, heads=6, head_dim=32, ff_dim=768, dropout=0.1,
                                 subsampling=1, subsampling_channels=32, shared_qk=False,
                                 positions="sinusoidal", norm="pre", input_norm=False,
                                 attention=validate_attention("iclustered", clusters=100))
    states, lengths = encoder(features, feature_lengths)   # normalised (B, T, F) -> (B, T', D)
    encoder.set_attention(validate_attention("full"))       # same weights, other attention

The attention comes as an attention_ext.ValidatedAttention: it was checked where it was read
(a config, a spec, a checkpoint), so the encoder builds it as it is. Each layer owns its
query/key/value/output projections; the attention itself is parameter-free, so a state dict
runs under any attention.
With `shared_qk` the layer has one query/key projection and passes the very same tensor as
q and k (what lsh and shared_full need, and what lets clustered attention approximate
shared-full).

Positions (`positions`, POSITION_SCHEMES):
- sinusoidal: the fixed table of Vaswani et al. added to the input (the paper's encoder). Absolute:
  a model reads positions far beyond those it was trained on when it runs on a long recording.
- sinusoidal_offset: the same table, but in training each sequence reads it from a random offset
  in [0, MAX_POSITION_OFFSET) (Ruoss et al., 2023, "Randomized positional encodings boost length
  generalization of transformers", with a random shift instead of random sorted positions): the
  model learns to use where frames are relative to each other, not where an utterance starts, and
  has seen every position an hour's one pass reads. Evaluation reads it from 0, like sinusoidal.
- rotary: RoFormer's rotary positions (Su et al., 2021) applied to every layer's queries and keys
  before the attention, so a score depends on the two positions' distance alone. The same rotated
  tensor is passed as q and k in a shared-QK model, so every attention takes it as it is.
- none: nothing; the order comes from the convolutional front end alone (its 3x3 kernels see the
  neighbouring frames), so every attention is a function of content and a model never meets a
  position it has not seen. Needs model.subsampling 2 or 4 (factor 1 has no convolution).

Layer form (`norm`, NORMS):
- pre: x + Attn(LN(x)), then x + FF(LN(x)) (the default; every model trained before the choice existed).
- post: LN(x + Attn(x)), then LN(x + FF(x)): the layer of the reference library the paper's models
  were built with (idiap/fast-transformers, TransformerEncoderLayer), Vaswani et al.'s form.
Both forms have the same parameters under the same names (the post form's `attention_norm` is the
norm after the attention block, its `ff_norm` the one after the feed-forward block), and both end
with `final_norm`: the reference library's TransformerEncoderBuilder adds that final LayerNorm by
default (final_normalization=True) to its post-norm layers too. So a state dict fits either form;
the checkpoint's `model.norm` says which one it was trained in.

Input normalisation (`input_norm`): a LayerNorm over the scaled input plus its positions, before
the first layer (as BERT and RoBERTa normalise their embeddings). A post-norm layer feeds its
queries and keys the un-normalised input: every later layer reads a LayerNorm's output, but the first
reads sqrt(d_model) x the front end's output, several times the unit scale, so its attention
logits (quadratic in it) start many times the other layers' and its softmax is saturated from the
first step: a hard match on content from anywhere in the utterance, whose gradient vanishes
(measured per layer in recipes/synth/README.md, "why the paper's encoder needs its input
normalised"). input_norm gives the first layer the scale of the others.
Off by default (every model trained before it existed). A pre-norm layer normalises what its
attention reads anyway; there input_norm only rescales the residual stream.
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from attention_ext import SharedQKRequiredError, ValidatedAttention, build_in_reformer_form
from asr.model.dropout import Dropout


def check_attention_fits(attention: ValidatedAttention, shared_qk: bool, head_dim: int) -> None:
    """Refuses an attention that needs shared query/key projections on a model without them,
    and one with an option larger than the model's head dim (agglomerative's classes)."""
    attention.check_head_dim(head_dim)
    if attention.needs_shared_qk and not shared_qk:
        raise SharedQKRequiredError(
            f"attention '{attention.name}' needs shared query/key projections, but this model has "
            "model.shared_qk=false; train with model.shared_qk=true (a model trained without "
            f"them cannot run '{attention.name}')")


def valid_mask(lengths: torch.Tensor, length: int) -> torch.Tensor:
    """(B, N) bool, True inside each sequence."""
    return torch.arange(length, device=lengths.device) < lengths[:, None]


POSITION_SCHEMES = ("sinusoidal", "sinusoidal_offset", "rotary", "none")
NORMS = ("pre", "post")
# sinusoidal_offset's training offsets: 2^18 encoder positions, 87 minutes at subsampling 2.
MAX_POSITION_OFFSET = 1 << 18


# (time, frequency) stride of each convolution per subsampling factor; asr.config.schema allows these factors.
SUBSAMPLING_STRIDES = {1: (), 2: (2, 1), 4: (2, 2)}


class ConvSubsampling(nn.Module):
    """Shortens time by `factor` (1, 2 or 4) and projects features to the model width.

    factor 1 is a linear projection (the paper's setup). factor 2 and 4 are two 3x3 Conv2d
    layers over (time, frequency), each followed by ReLU, with strides (2, 1) and (2, 2) as in
    ESPnet's Conv2dSubsampling2 / Conv2dSubsampling: the second convolution gives every encoder
    position 70 ms (factor 2) or 110 ms (factor 4) of local context before the first attention,
    which shortens CTC's initial all-blank plateau a lot on our CPU budgets. Padding 1 keeps a
    stride-2 convolution at ceil(T / 2) frames. Padded frames are zeroed before every
    convolution, so a sequence gives the same output alone or inside a padded batch.

    The activations are channels-last, (B, T, F, C) in memory, and each convolution sees a
    (B, C, T, F) view of them: the layout inductor picks for CPU convolutions, so an eager run,
    a trace and the compiled code agree on every stride (see forward).
    """

    def __init__(self, feature_dim: int, d_model: int, factor: int, channels: int):
        super().__init__()
        self.factor = factor
        self.strides = SUBSAMPLING_STRIDES[factor]   # the factor is checked where the config is read
        self.convs = nn.ModuleList(
            nn.Conv2d(1 if i == 0 else channels, channels, kernel_size=3, stride=stride, padding=1)
            for i, stride in enumerate(self.strides))
        freq = feature_dim
        for stride in self.strides:
            freq = (freq - 1) // stride + 1
        self.projection = nn.Linear((channels if self.strides else 1) * freq, d_model)

    def output_lengths(self, lengths: torch.Tensor) -> torch.Tensor:
        for stride in self.strides:
            lengths = (lengths - 1) // stride + 1 if stride > 1 else lengths
        return lengths

    # Evaluation of an input longer than this runs the convolutions piece by piece: their
    # activations are channels x frequency (640 floats at the demo's size) per frame, 2.3 GB
    # for an hour's 360,000 frames at once.
    PIECE_FRAMES = 16384
    # Output frames computed on each side of a piece and dropped: more than the two 3x3
    # convolutions' reach (one output frame each way), so the kept frames are those of a whole run.
    PIECE_MARGIN = 4

    def forward(self, x: torch.Tensor, lengths: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        if x.shape[1] > self.PIECE_FRAMES and not self.training and not torch.compiler.is_compiling():
            return self._forward_in_pieces(x, lengths)
        return self._forward_whole(x, lengths)

    def _forward_in_pieces(self, x: torch.Tensor, lengths: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """forward on a long input in bounded memory: pieces of PIECE_FRAMES input frames, each
        with PIECE_MARGIN output frames of neighbouring input on both sides; a piece starts on a
        multiple of the factor, so its output frames are the whole run's at the same time."""
        out_lengths = self.output_lengths(lengths)
        total = int(self.output_lengths(torch.tensor(x.shape[1])))
        step = self.PIECE_FRAMES // self.factor            # output frames per piece
        outputs = []
        for first in range(0, total, step):
            last = min(total, first + step)
            begin = max(0, first - self.PIECE_MARGIN) * self.factor
            end = min(x.shape[1], (last + self.PIECE_MARGIN) * self.factor)
            piece, _ = self._forward_whole(x[:, begin:end], (lengths - begin).clamp(0, end - begin))
            offset = first - begin // self.factor
            outputs.append(piece[:, offset:offset + last - first])
        return torch.cat(outputs, dim=1), out_lengths

    def _forward_whole(self, x: torch.Tensor, lengths: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        # Channels-last on purpose: compiled, inductor runs these convolutions channels-last (on
        # the CPU always, elsewhere because compile_encoder asks it to), even with symbolic
        # lengths. Had the eager layout been (B, C, T, F), the activations saved for the backward
        # would get other strides from the compiled forward than from the trace, and torch 2.13
        # then bakes the first batch's length into the compiled backward as constant strides
        # (pytorch/pytorch#191885): `assert_size_stride` failed on a batch of another length
        # with the same subsampled length. With the same layout in eager mode nothing is baked.
        x = x.unsqueeze(-1)                                        # (B, T, F, 1)
        for conv, stride in zip(self.convs, self.strides):
            # The mask is (B, T, 1), not (B, T, 1, 1): a 4D mask saved for the backward is laid out
            # channels-last by inductor, whose sort of its symbolic strides (T, 1, T, T) then fails
            # ("cannot determine truth value of Relational"). Flattening (F, C) costs nothing.
            x = (x.flatten(2) * valid_mask(lengths, x.shape[1])[:, :, None]).view_as(x)
            x = F.relu(conv(x.permute(0, 3, 1, 2))).permute(0, 2, 3, 1)     # (B, T', F', C)
            if stride > 1:
                lengths = (lengths - 1) // stride + 1
        batch, time, freq, channels = x.shape
        # each frame's features channel by channel (the projection's weights are in that order)
        x = x.transpose(2, 3).reshape(batch, time, channels * freq)
        return self.projection(x), lengths


def sinusoidal_positions(length: int, d_model: int, device=None) -> torch.Tensor:
    """(length, d_model) fixed encodings of Vaswani et al.: sin on even, cos on odd dims."""
    position = torch.arange(length, device=device, dtype=torch.float32)[:, None]
    frequency = torch.exp(torch.arange(0, d_model, 2, device=device, dtype=torch.float32)
                          * (-math.log(10000.0) / d_model))
    table = torch.zeros(length, d_model, device=device)
    table[:, 0::2] = torch.sin(position * frequency)
    table[:, 1::2] = torch.cos(position * frequency[: d_model // 2])
    return table


ROTARY_BASE = 10000.0   # RoFormer's: the slowest pair turns once in about 2 pi * 10000 positions


def rotary_angles(length: int, head_dim: int, device=None) -> tuple[torch.Tensor, torch.Tensor]:
    """(length, head_dim / 2) cos and sin of position * ROTARY_BASE^(-2i / head_dim) (RoFormer eq. 15).
    The angles are float64: in float32 the fastest pair's angle is off by ~0.02 rad at position
    200,000 (an hour), and a score would no longer depend on the distance alone."""
    frequency = ROTARY_BASE ** (-torch.arange(0, head_dim, 2, device=device, dtype=torch.float64) / head_dim)
    angle = torch.arange(length, device=device, dtype=torch.float64)[:, None] * frequency
    return angle.cos().float(), angle.sin().float()


def rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """(B, H, N, E) rotated pair by pair: dims i and i + E/2 form the i-th pair (GPT-NeoX's layout,
    two contiguous halves), each turned by its position's angle."""
    first, second = x.chunk(2, dim=-1)
    return torch.cat((first * cos - second * sin, second * cos + first * sin), dim=-1).to(x.dtype)


def sinusoidal_positions_from(offsets: torch.Tensor, length: int, d_model: int) -> torch.Tensor:
    """(B, length, d_model): sinusoidal_positions' table read from position offsets[b] on for each
    sequence b. The angles are float64: in float32 the fastest dims' angle is off by up to 0.02 rad
    at position 2^18."""
    position = (offsets[:, None].to(torch.float64)
                + torch.arange(length, device=offsets.device, dtype=torch.float64))[..., None]
    frequency = torch.exp(torch.arange(0, d_model, 2, device=offsets.device, dtype=torch.float64)
                          * (-math.log(10000.0) / d_model))
    angle = position * frequency                                       # (B, length, d_model / 2)
    return torch.stack((angle.sin(), angle.cos()), dim=-1).flatten(2).float()


class EncoderLayer(nn.Module):
    """norm "pre": x + Attn(LN(x)), then x + FF(LN(x)); norm "post": LN(x + Attn(x)), then
    LN(x + FF(x)). The projections live here, the attention is swappable."""

    def __init__(self, d_model: int, heads: int, ff_dim: int, dropout: float, shared_qk: bool,
                 attention: nn.Module, norm: str = "pre"):
        super().__init__()
        if norm not in NORMS:
            raise ValueError(f"norm={norm!r}: must be one of {', '.join(NORMS)}")
        self.heads, self.shared_qk, self.norm = heads, shared_qk, norm
        self.attention_norm = nn.LayerNorm(d_model)
        self.query = nn.Linear(d_model, d_model)
        # The key projection is drawn even when the model shares it with the query, so that with one
        # seed a shared-QK and a separate-QK model start from the same weights in every other
        # parameter: a comparison of attentions then does not also compare two random initialisations
        # (a different draw was what kept seed 0's shared-QK presets on CTC's blank plateau; asr/RESULTS.md).
        key = nn.Linear(d_model, d_model)
        self.key = None if shared_qk else key
        self.value = nn.Linear(d_model, d_model)
        self.output = nn.Linear(d_model, d_model)
        self.attention = attention
        self.ff_norm = nn.LayerNorm(d_model)
        self.ff = nn.Sequential(nn.Linear(d_model, ff_dim), nn.ReLU(), Dropout(dropout),
                                nn.Linear(ff_dim, d_model))
        self.dropout = Dropout(dropout)

    def _split_heads(self, x: torch.Tensor) -> torch.Tensor:
        batch, length, width = x.shape
        return x.view(batch, length, self.heads, width // self.heads).transpose(1, 2)

    def attention_input(self, x: torch.Tensor) -> torch.Tensor:
        """What the query, key and value projections read from the layer's input x: LN(x) in the
        pre-norm form, x itself in the post-norm form (the layer before ended with a LayerNorm; the
        first layer reads the scaled input with its positions)."""
        return self.attention_norm(x) if self.norm == "pre" else x

    def queries_and_keys(self, h: torch.Tensor, rotary: tuple[torch.Tensor, torch.Tensor] | None = None
                         ) -> tuple[torch.Tensor, torch.Tensor]:
        """(B, H, N, E) queries and keys of h (attention_input of the layer's input), turned by `rotary` (cos and sin,
        rotary_angles) when given; the same object when shared."""
        q = self._split_heads(self.query(h))
        k = q if self.shared_qk else self._split_heads(self.key(h))
        if rotary is not None:
            q, k = (rotate(q, *rotary),) * 2 if k is q else (rotate(q, *rotary), rotate(k, *rotary))
        return q, k

    def forward(self, x: torch.Tensor, lengths: torch.Tensor,
                rotary: tuple[torch.Tensor, torch.Tensor] | None = None) -> torch.Tensor:
        """rotary: the (N, E/2) cos and sin of rotary positions (rotary_angles), or None."""
        h = self.attention_input(x)
        q, k = self.queries_and_keys(h, rotary)
        v = self._split_heads(self.value(h))
        del h          # each tensor let go as soon as it is used: a long evaluation holds fewer at once
        attended = self.attention(q, k, v, lengths)                    # (B, H, N, E)
        del q, k, v
        x = x + self.attention_update(attended)
        del attended
        return self.feed_forward_stage(x)

    # forward in three parts, so that asr.model.diagnostics can feed a layer another attention's output
    # and see how far the layer's output moves
    def attention_update(self, attended: torch.Tensor) -> torch.Tensor:
        """What the attention's (B, H, N, E) output adds to the residual stream: the heads merged and
        projected, then dropout."""
        batch, heads, length, dim = attended.shape
        return self.dropout(self.output(attended.transpose(1, 2).reshape(batch, length, heads * dim)))

    def feed_forward_stage(self, x: torch.Tensor) -> torch.Tensor:
        """The rest of the layer from x, its input plus the attention's update: the post-norm form's
        first LayerNorm, the feed-forward block with its residual, the post-norm form's second one."""
        if self.norm == "pre":
            return x + self.dropout(self._feed_forward(x))
        x = self.attention_norm(x)
        return self.ff_norm(x + self.dropout(self._feed_forward(x)))

    # Evaluation of a sequence longer than this runs the feed-forward block piece by piece: its
    # hidden activations are ff_dim floats per position (0.7 GB for an hour at the demo's size, twice).
    PIECE_POSITIONS = 16384

    def _feed_forward_block(self, x: torch.Tensor) -> torch.Tensor:
        """The feed-forward block on x, normalised first in the pre-norm form."""
        return self.ff(self.ff_norm(x) if self.norm == "pre" else x)

    def _feed_forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.shape[1] <= self.PIECE_POSITIONS or self.training or torch.compiler.is_compiling():
            return self._feed_forward_block(x)
        out = torch.empty_like(x)
        for first in range(0, x.shape[1], self.PIECE_POSITIONS):   # position-wise: the same numbers
            piece = slice(first, first + self.PIECE_POSITIONS)
            out[:, piece] = self._feed_forward_block(x[:, piece])
        return out


class TransformerEncoder(nn.Module):
    """Normalised filter-bank features -> encoder states for the CTC heads."""

    # No defaults: they live in the config schema (asr.config.schema.ModelConfig), which also checks the values.
    def __init__(self, feature_dim: int, *, layers: int, heads: int, head_dim: int, ff_dim: int, dropout: float,
                 subsampling: int, subsampling_channels: int, shared_qk: bool, positions: str, norm: str,
                 input_norm: bool, attention: ValidatedAttention):
        super().__init__()
        if norm not in NORMS:
            raise ValueError(f"norm={norm!r}: must be one of {', '.join(NORMS)}")
        if positions not in POSITION_SCHEMES:
            raise ValueError(f"positions={positions!r}: must be one of {', '.join(POSITION_SCHEMES)}")
        if positions == "none" and subsampling == 1:
            raise ValueError("positions='none' needs a convolutional front end (subsampling 2 or 4): with "
                             "subsampling 1 nothing tells the encoder the order of its frames")
        self.positions, self.norm = positions, norm
        self.d_model = heads * head_dim
        self.head_dim = head_dim
        self.input_scale = math.sqrt(self.d_model)
        self.shared_qk = shared_qk
        self.frontend = ConvSubsampling(feature_dim, self.d_model, subsampling, subsampling_channels)
        self.input_norm = nn.LayerNorm(self.d_model) if input_norm else None
        self.input_dropout = Dropout(dropout)
        self.layers = nn.ModuleList(
            EncoderLayer(self.d_model, heads, ff_dim, dropout, shared_qk, attention.build(), norm)
            for _ in range(layers))
        # Kept in the post-norm form too, as the reference library's encoder builder does (see the
        # module docstring): the same parameters in both forms, and the CTC heads read a LayerNorm's
        # output either way. After a post-norm layer, whose own last step is a LayerNorm, it normalises
        # that output once more (after the layer's learned scale and shift).
        self.final_norm = nn.LayerNorm(self.d_model)
        self.attention_name, self.attention_options = attention.name, dict(attention.options)

    @property
    def subsampling(self) -> int:
        return self.frontend.factor

    def output_lengths(self, lengths: torch.Tensor) -> torch.Tensor:
        return self.frontend.output_lengths(lengths)

    def set_attention(self, attention: ValidatedAttention, reformer_keys: bool = False,
                      layers: list[int] | None = None) -> None:
        """Replaces every layer's attention by `attention` (weights unchanged); with `layers`
        (indexes), only those layers' attention, the others keeping theirs.

        reformer_keys: run it in the Reformer key form of a shared-QK model (unit keys, no
        attention to self; attention_ext.build_in_reformer_form), the form a model trained with
        shared_full or lsh learned. `attention` was checked against this model where it was read
        (check_attention_fits, called once by whoever validates it: asr.config.schema.validate_config
        for training, asr.evaluation.attention_choice.evaluation_attention for an evaluation). Raises
        attention_ext.SharedQKRequiredError for reformer_keys on a model without shared query/key
        projections, AttentionConfigError for an attention without a Reformer form, and then
        changes nothing. `attention_name` and `attention_options` name the attention last set in
        every layer: a swap of some layers (the gap by layer of recipes/synth/sharpening.py) leaves them.
        """
        chosen = range(len(self.layers)) if layers is None else list(layers)
        if any(not 0 <= index < len(self.layers) for index in chosen):
            raise IndexError(f"layers {list(chosen)}: this encoder has layers 0 to {len(self.layers) - 1}")
        if reformer_keys and not self.shared_qk:
            raise SharedQKRequiredError("the Reformer key form (unit keys, no attention to self) needs shared "
                                        "query/key projections, but this model has model.shared_qk=false")
        build = (lambda: build_in_reformer_form(attention)) if reformer_keys else attention.build
        modules = [build() for _ in chosen]   # all built before any layer changes
        for index, module in zip(chosen, modules):
            self.layers[index].attention = module
        if layers is None:
            self.attention_name, self.attention_options = attention.name, dict(attention.options)

    def forward(self, features: torch.Tensor, lengths: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(B, T, F) normalised features, (B,) frame counts -> (B, T', D) states, (B,) lengths T'."""
        x, lengths = self.frontend(features, lengths)
        # sqrt(d_model) keeps the content well above the unit-amplitude positions (as in ESPnet)
        x = x * self.input_scale
        if self.positions == "sinusoidal_offset" and self.training:
            offsets = torch.randint(0, MAX_POSITION_OFFSET, (x.shape[0],), device=x.device)
            x = x + sinusoidal_positions_from(offsets, x.shape[1], self.d_model)
        elif self.positions in ("sinusoidal", "sinusoidal_offset"):
            x = x + sinusoidal_positions(x.shape[1], self.d_model, x.device)
        rotary = rotary_angles(x.shape[1], self.head_dim, x.device) if self.positions == "rotary" else None
        if self.input_norm is not None:
            x = self.input_norm(x)
        x = self.input_dropout(x)
        for layer in self.layers:
            x = layer(x, lengths, rotary)
        return self.final_norm(x), lengths


def compile_encoder(encoder: TransformerEncoder, cuda_graphs: bool = False) -> None:
    """torch.compile the encoder in place, as `trainer.compile=true` does: fullgraph (any attention
    traces as one graph), and the state dict keeps its keys, so checkpoints load without compile.

    `force_layout_optimization` works around pytorch/pytorch#191306 (torch 2.13): inductor lays
    out a graph channels-last only if it counts convolutions in it, and a backward graph holds
    only convolution backwards, so the front end's backward was lowered the other way, which
    guards on its strides: it specialised the graph to one subsampled length (a recompilation for
    every new one) or failed to lower. Forced, the backward runs channels-last as the forward and
    the eager front end do (ConvSubsampling.forward), and one graph with symbolic lengths serves
    every batch.

    `triton.coalesce_tiling_analysis` off works around an inductor assertion on CUDA (torch 2.11,
    `get_pw_red_splits` in tiling_utils.py, with symbolic lengths): with it on, the demo preset's
    first compiled step failed on an H200 (attention_ext/RESULTS.md, "The GPU: status and known costs"); off, it trained.
    It only chooses the tiling of GPU kernels, so the CPU is unaffected.

    `cuda_graphs`: inductor's own CUDA graphs too (what mode="reduce-overhead" turns on; torch.compile
    takes a mode or options, not both): the step benchmark's mode compiled-graphs, to measure against
    asr.model.graphed_encoder.
    """
    encoder.compile(fullgraph=True, options={"force_layout_optimization": True,
                                             "triton.coalesce_tiling_analysis": False,
                                             "triton.cudagraphs": cuda_graphs})

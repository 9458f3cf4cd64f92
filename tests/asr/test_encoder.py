"""The encoder: its layer against a brute-force transformer layer, subsampling, shared QK, attention swap."""
import copy
import math

import pytest
import torch

from attention_ext import AttentionConfigError, SharedQKRequiredError, validate_attention
from asr.model.encoder import EncoderLayer, TransformerEncoder, check_attention_fits, compile_encoder, sinusoidal_positions
from asr.model.diagnostics import relative_attention_entropy
from asr.model.recognizer import CheckpointMismatchError, check_state_dict_fits


ENCODER_SETTINGS = dict(feature_dim=12, layers=2, heads=2, head_dim=4, ff_dim=16, dropout=0.0, subsampling=1,
                        subsampling_channels=4, shared_qk=False, positions="sinusoidal", norm="pre", input_norm=False,
                        attention=validate_attention("full"))


def tiny_encoder(**overrides):
    settings = {**ENCODER_SETTINGS, **overrides}
    return TransformerEncoder(**settings).eval()


def brute_force_rotation(x: torch.Tensor) -> torch.Tensor:
    """(N, E) rows turned by RoFormer's rotation: row p's pair (i, i + E/2) by the 2x2 matrix of
    angle p * 10000^(-2i/E), one matrix at a time."""
    out = torch.empty_like(x)
    half = x.shape[-1] // 2
    for p in range(x.shape[0]):
        for i in range(half):
            angle = p * 10000.0 ** (-2 * i / x.shape[-1])
            rotation = torch.tensor([[math.cos(angle), -math.sin(angle)], [math.sin(angle), math.cos(angle)]])
            out[p, [i, i + half]] = rotation @ x[p, [i, i + half]]
    return out


def brute_force_attention_block(layer: EncoderLayer, h: torch.Tensor, rotary: bool = False) -> torch.Tensor:
    """The attention block's output projection for ONE sequence h (N, D), one head at a time."""
    q = h @ layer.query.weight.T + layer.query.bias
    k = q if layer.key is None else h @ layer.key.weight.T + layer.key.bias
    v = h @ layer.value.weight.T + layer.value.bias
    dim = h.shape[-1] // layer.heads
    heads = []
    for i in range(layer.heads):
        part = slice(i * dim, (i + 1) * dim)
        head_q, head_k = q[:, part], k[:, part]
        if rotary:
            head_q, head_k = brute_force_rotation(head_q), brute_force_rotation(head_k)
        scores = head_q @ head_k.T / math.sqrt(dim)
        heads.append(torch.softmax(scores, dim=-1) @ v[:, part])
    return torch.cat(heads, dim=-1) @ layer.output.weight.T + layer.output.bias


def brute_force_feed_forward(layer: EncoderLayer, h: torch.Tensor) -> torch.Tensor:
    first, second = layer.ff[0], layer.ff[3]
    return torch.relu(h @ first.weight.T + first.bias) @ second.weight.T + second.bias


def layer_norm(x: torch.Tensor, norm: torch.nn.LayerNorm) -> torch.Tensor:
    """(x - mean) / sqrt(var + eps) * weight + bias over the last dim, written out."""
    mean = x.mean(-1, keepdim=True)
    variance = ((x - mean) ** 2).mean(-1, keepdim=True)
    return (x - mean) / torch.sqrt(variance + norm.eps) * norm.weight + norm.bias


def brute_force_layer(layer: EncoderLayer, x: torch.Tensor, length: int, rotary: bool = False) -> torch.Tensor:
    """One pre-norm layer for ONE sequence written out with explicit loops over heads."""
    x = x[:length]
    x = x + brute_force_attention_block(layer, layer_norm(x, layer.attention_norm), rotary)
    return x + brute_force_feed_forward(layer, layer_norm(x, layer.ff_norm))


def brute_force_post_norm_layer(layer: EncoderLayer, x: torch.Tensor, length: int) -> torch.Tensor:
    """One post-norm layer for ONE sequence, as the reference library's TransformerEncoderLayer
    (idiap/fast-transformers) computes it: x = norm1(x + attention(x)); norm2(x + ff(x)), with norm1
    the layer's attention_norm and norm2 its ff_norm."""
    x = x[:length]
    x = layer_norm(x + brute_force_attention_block(layer, x), layer.attention_norm)
    return layer_norm(x + brute_force_feed_forward(layer, x), layer.ff_norm)


@pytest.mark.parametrize("shared_qk", [False, True])
def test_layer_equals_brute_force_transformer_layer_on_valid_positions(shared_qk):
    torch.manual_seed(0)
    encoder = tiny_encoder(shared_qk=shared_qk, attention=validate_attention("full"))
    layer = encoder.layers[0]
    x = torch.randn(2, 7, 8)
    lengths = torch.tensor([7, 4])
    with torch.no_grad():
        out = layer(x, lengths)
        for b, length in enumerate(lengths.tolist()):
            torch.testing.assert_close(out[b, :length], brute_force_layer(layer, x[b], length),
                                       rtol=1e-5, atol=1e-5)


def randomise_norms(encoder: TransformerEncoder) -> None:
    """LayerNorm weights and biases away from 1 and 0, so a test sees which norm is applied where."""
    with torch.no_grad():
        for module in encoder.modules():
            if isinstance(module, torch.nn.LayerNorm):
                module.weight.uniform_(0.5, 1.5)
                module.bias.normal_(0.0, 0.3)


@pytest.mark.parametrize("shared_qk", [False, True])
def test_post_norm_layer_equals_the_reference_librarys_layer_written_out(shared_qk):
    torch.manual_seed(0)
    encoder = tiny_encoder(shared_qk=shared_qk, norm="post")
    randomise_norms(encoder)
    layer = encoder.layers[0]
    x = torch.randn(2, 7, 8) * 3
    lengths = torch.tensor([7, 4])
    with torch.no_grad():
        out = layer(x, lengths)
        assert layer.attention_input(x) is x        # the projections read the input itself
        for b, length in enumerate(lengths.tolist()):
            expected = brute_force_post_norm_layer(layer, x[b], length)
            torch.testing.assert_close(out[b, :length], expected, rtol=1e-5, atol=1e-5)
            assert not torch.allclose(expected, brute_force_layer(layer, x[b], length), atol=1e-3)


def test_post_norm_encoder_is_its_front_end_positions_layers_and_final_norm_written_out():
    torch.manual_seed(0)
    encoder = tiny_encoder(norm="post", layers=3)
    randomise_norms(encoder)
    features, lengths = torch.randn(2, 11, 12), torch.tensor([11, 6])
    with torch.no_grad():
        out, _ = encoder(features, lengths)
        for b, length in enumerate(lengths.tolist()):
            x = features[b, :length] @ encoder.frontend.projection.weight.T + encoder.frontend.projection.bias
            x = x * math.sqrt(8) + sinusoidal_positions(length, 8)
            for layer in encoder.layers:
                x = brute_force_post_norm_layer(layer, x, length)
            torch.testing.assert_close(out[b, :length], layer_norm(x, encoder.final_norm), rtol=1e-5, atol=1e-5)


def test_input_norm_is_a_layer_norm_of_the_scaled_input_and_its_positions_before_the_first_layer():
    torch.manual_seed(0)
    encoder = tiny_encoder(norm="post", layers=3, input_norm=True)
    randomise_norms(encoder)                       # its scale and shift count too
    features, lengths = torch.randn(2, 11, 12), torch.tensor([11, 6])
    with torch.no_grad():
        out, _ = encoder(features, lengths)
        for b, length in enumerate(lengths.tolist()):
            x = features[b, :length] @ encoder.frontend.projection.weight.T + encoder.frontend.projection.bias
            x = layer_norm(x * math.sqrt(8) + sinusoidal_positions(length, 8), encoder.input_norm)
            for layer in encoder.layers:
                x = brute_force_post_norm_layer(layer, x, length)
            torch.testing.assert_close(out[b, :length], layer_norm(x, encoder.final_norm), rtol=1e-5, atol=1e-5)
    assert {key for key in encoder.state_dict() if key.startswith("input_norm.")} == {"input_norm.weight",
                                                                                       "input_norm.bias"}
    assert not any(key.startswith("input_norm.") for key in tiny_encoder().state_dict())


def attention_entropy_by_layer(encoder: TransformerEncoder, length: int = 300) -> list[float]:
    """Mean relative entropy of each layer's exact attention at initialisation on unit-variance
    features (what the data module's normalisation gives)."""
    inputs = {}
    for index, layer in enumerate(encoder.layers):
        layer.attention.register_forward_pre_hook(lambda module, args, index=index: inputs.__setitem__(index, args))
    with torch.no_grad():
        encoder(torch.randn(1, length, 40), torch.tensor([length]))
    entropies = []
    for index in range(len(encoder.layers)):
        q, k, _, lengths = inputs[index]
        entropy, counted = relative_attention_entropy(q, k, lengths, shared_qk=False)
        entropies.append(entropy[counted].mean().item())
    return entropies


def test_without_input_norm_a_post_norm_first_layer_starts_with_saturated_attention():
    """Why input_norm exists: at the paper's width (6 heads x 32) the first post-norm layer reads
    sqrt(192) x the projected features, and its attention starts nearly one-hot (~0.04 of uniform's
    entropy) while every other layer's is near uniform; with input_norm it starts as the others do."""
    paper = dict(feature_dim=40, layers=2, heads=6, head_dim=32, ff_dim=64, norm="post")
    torch.manual_seed(0)
    plain = attention_entropy_by_layer(tiny_encoder(**paper))
    torch.manual_seed(0)
    normalised = attention_entropy_by_layer(tiny_encoder(**paper, input_norm=True))
    assert plain[0] < 0.2 and plain[1] > 0.95
    assert min(normalised) > 0.95


def test_both_layer_forms_have_the_same_parameters_and_the_form_is_what_differs():
    torch.manual_seed(0)
    pre = tiny_encoder(norm="pre")
    post = tiny_encoder(norm="post")
    post.load_state_dict(pre.state_dict())       # the same names and shapes: a state dict fits either
    check_state_dict_fits(post, pre.state_dict(), "pre-norm weights")
    features, lengths = torch.randn(1, 9, 12), torch.tensor([9])
    with torch.no_grad():
        assert not torch.allclose(pre(features, lengths)[0], post(features, lengths)[0], atol=1e-3)
    assert [layer.norm for layer in post.layers] == ["post", "post"] and post.norm == "post"
    with pytest.raises(ValueError, match="norm='sandwich': must be one of pre, post"):
        tiny_encoder(norm="sandwich")


@pytest.mark.parametrize("shared_qk", [False, True])
def test_rotary_layer_equals_brute_force_rotation_of_queries_and_keys(shared_qk):
    from asr.model.encoder import rotary_angles
    torch.manual_seed(0)
    encoder = tiny_encoder(shared_qk=shared_qk, positions="rotary")
    layer = encoder.layers[0]
    x = torch.randn(2, 7, 8)
    lengths = torch.tensor([7, 4])
    with torch.no_grad():
        out = layer(x, lengths, rotary_angles(7, 4))
        for b, length in enumerate(lengths.tolist()):
            torch.testing.assert_close(out[b, :length], brute_force_layer(layer, x[b], length, rotary=True),
                                       rtol=1e-5, atol=1e-5)


def test_rotary_scores_depend_on_the_distance_alone():
    """q at p and k at p + d score the same for every p, also far beyond any training length."""
    from asr.model.encoder import rotary_angles, rotate
    torch.manual_seed(0)
    q, k = torch.randn(8, dtype=torch.float64), torch.randn(8, dtype=torch.float64)
    cos, sin = (table.double() for table in rotary_angles(200_021, 8))
    scores = []
    for p in (0, 17, 5_000, 200_000):
        at = slice(p, p + 1)
        rotated_q = rotate(q[None, None, None], cos[at], sin[at])
        rotated_k = rotate(k[None, None, None], cos[p + 20:p + 21], sin[p + 20:p + 21])
        scores.append(float((rotated_q * rotated_k).sum()))
    assert scores == pytest.approx([scores[0]] * 4, abs=1e-5)


@pytest.mark.parametrize("positions", ["sinusoidal", "rotary", "none"])
def test_the_encoder_takes_each_position_scheme_as_written_out(positions):
    """The whole encoder against its parts run by hand: sinusoidal adds the table to the scaled
    front end's output, rotary turns every layer's queries and keys, none adds nothing."""
    torch.manual_seed(0)
    encoder = tiny_encoder(positions=positions, subsampling=2, subsampling_channels=3)
    features, lengths = torch.randn(1, 14, 12), torch.tensor([14])
    with torch.no_grad():
        out, _ = encoder(features, lengths)
        x, out_lengths = encoder.frontend(features, lengths)
        x = x[0] * math.sqrt(8)
        if positions == "sinusoidal":
            x = x + sinusoidal_positions(len(x), 8)
        for layer in encoder.layers:
            x = brute_force_layer(layer, x, len(x), rotary=positions == "rotary")
        expected = encoder.final_norm(x)
    torch.testing.assert_close(out[0], expected, rtol=1e-5, atol=1e-5)


def test_sinusoidal_offset_reads_the_table_from_a_random_offset_in_training_and_from_0_in_evaluation():
    """Training: sequence b gets rows [o_b, o_b + N) of the sinusoidal formula (o_b drawn below
    MAX_POSITION_OFFSET); evaluation: rows [0, N), exactly what positions=sinusoidal adds."""
    from asr.model import encoder as encoder_module
    torch.manual_seed(0)
    encoder = tiny_encoder(positions="sinusoidal_offset", subsampling=2, subsampling_channels=3, layers=0)
    encoder.input_dropout = torch.nn.Identity()
    encoder.final_norm = torch.nn.Identity()
    features, lengths = torch.randn(3, 20, 12), torch.tensor([20, 20, 20])
    with torch.no_grad():
        content = encoder.frontend(features, lengths)[0] * math.sqrt(8)
        encoder.eval()
        torch.testing.assert_close(encoder(features, lengths)[0] - content, sinusoidal_positions(10, 8).expand(3, 10, 8),
                                   rtol=0, atol=1e-5)
        encoder.train()
        torch.manual_seed(3)
        offsets = torch.randint(0, encoder_module.MAX_POSITION_OFFSET, (3,))
        torch.manual_seed(3)
        added = encoder(features, lengths)[0] - content
    for b, offset in enumerate(offsets.tolist()):
        for row in (0, 9):
            position = offset + row
            expected = [f(position / 10000.0 ** (2 * i / 8)) for i in range(4) for f in (math.sin, math.cos)]
            torch.testing.assert_close(added[b, row], torch.tensor(expected), rtol=0, atol=1e-4)
    assert len(set(offsets.tolist())) == 3 and max(offsets.tolist()) > 1000


def test_positions_none_needs_a_convolutional_front_end():
    with pytest.raises(ValueError, match="subsampling 2 or 4"):
        tiny_encoder(positions="none", subsampling=1)
    with pytest.raises(ValueError, match="must be one of sinusoidal, sinusoidal_offset, rotary, none"):
        tiny_encoder(positions="alibi")


def test_shared_qk_passes_the_same_tensor_as_queries_and_keys():
    seen = []

    class Spy(torch.nn.Module):
        def forward(self, q, k, v, lengths):
            seen.append(k is q)
            return v

    for shared in (True, False):
        encoder = tiny_encoder(shared_qk=shared)
        encoder.layers[0].attention = Spy()
        encoder(torch.randn(1, 5, 12), torch.tensor([5]))
    assert seen == [True, False]
    assert tiny_encoder(shared_qk=True).layers[0].key is None   # one projection, no key weights


@pytest.mark.parametrize("factor", [1, 2, 4])
def test_subsampling_lengths_and_padding_independence(factor):
    torch.manual_seed(0)
    encoder = tiny_encoder(subsampling=factor, subsampling_channels=3)
    lengths = torch.tensor([23, 9, 1])
    features = torch.randn(3, 23, 12)
    with torch.no_grad():
        out, out_lengths = encoder(features, lengths)
        expected = [math.ceil(n / factor) for n in lengths.tolist()]   # ceil per stride-2 stage
        assert out_lengths.tolist() == expected and out.shape[1] == expected[0]
        assert encoder.output_lengths(lengths).tolist() == expected
        for b, n in enumerate(lengths.tolist()):   # alone == inside the padded batch
            alone, _ = encoder(features[b:b + 1, :n], torch.tensor([n]))
            torch.testing.assert_close(alone[0], out[b, :expected[b]], rtol=1e-5, atol=1e-5)



@pytest.mark.parametrize("factor", [2, 4])
def test_subsampling_computes_the_plain_convolution_stack(factor):
    """The channels-last front end (kept so for torch.compile) computes what the textbook
    (B, C, T, F) stack computes: mask, convolution, ReLU, twice; frames then flattened channel by
    channel into the projection (so checkpoints of either layout load into the other)."""
    torch.manual_seed(0)
    frontend = tiny_encoder(subsampling=factor, subsampling_channels=3).frontend
    features, lengths = torch.randn(3, 23, 12), torch.tensor([23, 9, 4])
    x, expected_lengths = features.unsqueeze(1), lengths
    for conv, stride in zip(frontend.convs, frontend.strides):
        x = torch.relu(conv(x * (torch.arange(x.shape[2]) < expected_lengths[:, None])[:, None, :, None]))
        expected_lengths = (expected_lengths - 1) // stride + 1
    expected = frontend.projection(x.transpose(1, 2).flatten(2))
    with torch.no_grad():
        got, got_lengths = frontend(features, lengths)
    assert torch.equal(got_lengths, expected_lengths)
    torch.testing.assert_close(got, expected.detach(), rtol=1e-5, atol=1e-5)

def test_sinusoidal_positions_follow_the_formula():
    table = sinusoidal_positions(3, 4)
    # dims (sin, cos) at frequencies 1 and 1/10000^(2/4) = 0.01
    expected = torch.tensor([[0.0, 1.0, 0.0, 1.0],
                             [math.sin(1), math.cos(1), math.sin(0.01), math.cos(0.01)],
                             [math.sin(2), math.cos(2), math.sin(0.02), math.cos(0.02)]])
    torch.testing.assert_close(table, expected)


def test_set_attention_swaps_every_layer_and_keeps_the_weights():
    encoder = tiny_encoder()
    before = {k: v.clone() for k, v in encoder.state_dict().items()}

    encoder.set_attention(validate_attention("full"))
    assert all(type(layer.attention).__name__ == "FullAttention" for layer in encoder.layers)
    assert len({id(layer.attention) for layer in encoder.layers}) == len(encoder.layers)
    after = encoder.state_dict()
    assert before.keys() == after.keys() and all(torch.equal(before[k], after[k]) for k in before)


def test_set_attention_with_layers_swaps_those_layers_only():
    encoder = tiny_encoder(layers=3)
    encoder.set_attention(validate_attention("clustered", clusters=2), layers=[1])
    assert [type(layer.attention).__name__ for layer in encoder.layers] == \
        ["FullAttention", "ClusteredAttention", "FullAttention"]
    assert encoder.attention_name == "full"          # names the attention of every layer, which a partial swap leaves
    encoder.set_attention(validate_attention("full"))
    assert all(type(layer.attention).__name__ == "FullAttention" for layer in encoder.layers)
    with pytest.raises(IndexError, match=r"layers \[3\]: this encoder has layers 0 to 2"):
        encoder.set_attention(validate_attention("clustered", clusters=2), layers=[3])


def test_an_attention_that_does_not_fit_the_model_is_refused_by_the_one_check():
    """check_attention_fits is the one check of an attention against a model (asr.config at
    composition, asr.evaluation where a spec is read); the encoder takes what it is given."""
    encoder = tiny_encoder()                                 # head_dim 4, no shared QK
    with pytest.raises(AttentionConfigError, match="unknown attention 'fancy'"):
        validate_attention("fancy")
    with pytest.raises(SharedQKRequiredError, match="model.shared_qk=true"):
        check_attention_fits(validate_attention("lsh"), encoder.shared_qk, encoder.head_dim)
    with pytest.raises(AttentionConfigError, match="needs shared query/key"):
        check_attention_fits(validate_attention("shared_full"), False, 4)
    with pytest.raises(AttentionConfigError, match=r"classes=8 exceeds the head dim 4.*model.head_dim >= 8"):
        check_attention_fits(validate_attention("agglomerative"), encoder.shared_qk, encoder.head_dim)
    with pytest.raises(AttentionConfigError, match=r"classes=5 exceeds the head dim 4"):
        check_attention_fits(validate_attention("agglomerative", classes=5), False, 4)
    check_attention_fits(validate_attention("agglomerative", classes=4), False, 4)
    encoder.set_attention(validate_attention("agglomerative", classes=4))
    out, _ = encoder(torch.randn(2, 6, 12), torch.tensor([6, 3]))
    assert torch.isfinite(out).all()


def test_the_reformer_key_form_is_refused_on_a_model_without_shared_qk():
    encoder = tiny_encoder()
    original = encoder.layers[0].attention
    with pytest.raises(SharedQKRequiredError, match="model.shared_qk=false"):
        encoder.set_attention(validate_attention("full"), reformer_keys=True)
    assert encoder.layers[0].attention is original        # nothing changed on failure


def test_state_dict_runs_under_another_attention_instance():
    torch.manual_seed(0)
    first, second = tiny_encoder(), tiny_encoder()
    second.load_state_dict(first.state_dict())
    features, lengths = torch.randn(2, 6, 12), torch.tensor([6, 3])
    with torch.no_grad():
        torch.testing.assert_close(first(features, lengths)[0], second(features, lengths)[0])


def test_checkpoint_of_another_shape_names_the_differing_tensors():
    small, wide = tiny_encoder(), tiny_encoder(head_dim=8)
    with pytest.raises(CheckpointMismatchError) as error:
        check_state_dict_fits(small, wide.state_dict(), "checkpoint x.ckpt")
    message = str(error.value)
    assert "layers.0.query.weight: (16, 16) in the checkpoint, (8, 8) here" in message
    shared = tiny_encoder(shared_qk=True)
    with pytest.raises(CheckpointMismatchError, match=r"only in the checkpoint \(4\): layers.0.key.weight"):
        check_state_dict_fits(shared, small.state_dict(), "checkpoint x.ckpt")
    check_state_dict_fits(small, tiny_encoder().state_dict(), "same shape")   # no error


@pytest.mark.parametrize("name, options", [("clustered", {"clusters": 64}), ("iclustered", {"clusters": 64, "topk": 4}),
                                           ("oracle_top", {"topk": 64})])
def test_swapped_in_attention_is_what_runs(name, options):
    """With more clusters (or top keys) than positions these attentions are exact (attention_ext/README.md), so the
    swapped model must reproduce the full-attention output; with few clusters it must not."""
    torch.manual_seed(0)
    encoder = tiny_encoder(layers=2)
    features, lengths = torch.randn(2, 20, 12), torch.tensor([20, 13])
    with torch.no_grad():
        reference, _ = encoder(features, lengths)
        encoder.set_attention(validate_attention(name, **options))
        assert all(layer.attention.attention_name == name for layer in encoder.layers)
        exact, _ = encoder(features, lengths)
        torch.testing.assert_close(exact[0], reference[0], rtol=1e-4, atol=1e-4)
        torch.testing.assert_close(exact[1, :13], reference[1, :13], rtol=1e-4, atol=1e-4)
        if name == "clustered":
            encoder.set_attention(validate_attention(name, clusters=2))
            approximate, _ = encoder(features, lengths)
            assert not torch.allclose(approximate[0], reference[0], atol=1e-3)


@pytest.mark.parametrize("name, options", [("shared_full", {}), ("lsh", {"rounds": 2, "chunk_size": 4}),
                                           ("clustered", {"clusters": 3}), ("iclustered", {"clusters": 3, "topk": 2})])
def test_shared_qk_model_runs_under_every_attention_with_gradients(name, options):
    torch.manual_seed(0)
    encoder = tiny_encoder(shared_qk=True).train()
    encoder.set_attention(validate_attention(name, **options))
    features, lengths = torch.randn(2, 17, 12, requires_grad=True), torch.tensor([17, 9])
    out, _ = encoder(features, lengths)
    out[0].sum().backward()
    assert torch.isfinite(out).all() and torch.isfinite(features.grad).all()
    assert encoder.layers[0].query.weight.grad.abs().sum() > 0


def test_shared_and_separate_qk_models_start_from_the_same_weights_but_the_key():
    """With one seed, a shared-QK encoder's parameters equal the separate-QK encoder's, key aside,
    so a shared-QK preset and the full preset compare attentions, not random draws."""
    torch.manual_seed(5)
    separate = dict(tiny_encoder(shared_qk=False).named_parameters())
    torch.manual_seed(5)
    shared = dict(tiny_encoder(shared_qk=True).named_parameters())
    assert set(separate) - set(shared) == {f"layers.{i}.key.{p}" for i in range(2) for p in ("weight", "bias")}
    for name, parameter in shared.items():
        assert torch.equal(parameter, separate[name]), name


def test_compiled_encoder_trains_on_batches_of_any_length():
    """trainer.compile=true's compile of an encoder with the convolution front end: forward and
    backward on batches of other lengths and sizes (odd and even; one with the subsampled length of
    the first, others with other subsampled lengths) give the eager output and gradients, from one
    graph with symbolic sizes. torch 2.13 baked the first length into the compiled backward's strides
    when eager and compiled layouts differed (the third batch of a training failed
    `assert_size_stride`), and its convolution backward specialised each subsampled length."""
    torch.manual_seed(0)
    eager = tiny_encoder(layers=1, subsampling=2, subsampling_channels=3).train()
    compiled = copy.deepcopy(eager)
    compile_encoder(compiled)
    torch._dynamo.utils.counters.clear()
    for index, (batch, length) in enumerate([(3, 38), (3, 37), (2, 36), (4, 41)]):
        features = torch.randn(batch, length, 12)
        lengths = torch.tensor([length] + [length - 5] * (batch - 1))
        if index == 0:
            # symbolic from the first batch on, as a training run's batches are from the second
            # (this skips a compilation for the first batch's shape alone)
            torch._dynamo.maybe_mark_dynamic(features, 0)
            torch._dynamo.maybe_mark_dynamic(features, 1)
            torch._dynamo.maybe_mark_dynamic(lengths, 0)
        results = []
        for model in (eager, compiled):
            model.zero_grad()
            out, out_lengths = model(features, lengths)
            (out * torch.linspace(-1, 1, out.shape[-1])).sum().backward()
            results.append((out.detach(), out_lengths, {n: p.grad.clone() for n, p in model.named_parameters()}))
        (expected, expected_lengths, expected_grads), (got, got_lengths, got_grads) = results
        assert torch.equal(got_lengths, expected_lengths) and got.shape[1] == math.ceil(length / 2)
        torch.testing.assert_close(got, expected, rtol=1e-4, atol=1e-5)
        for name in expected_grads:
            torch.testing.assert_close(got_grads[name], expected_grads[name], rtol=1e-4, atol=1e-5, msg=name)
    assert torch._dynamo.utils.counters["stats"]["unique_graphs"] == 1     # no recompilation per length
    torch._dynamo.reset()


def test_a_long_input_in_evaluation_runs_in_pieces_with_the_same_numbers(monkeypatch):
    """The front end's convolutions and the feed-forward blocks run piece by piece on inputs over
    their thresholds (here 16 frames and 8 positions): the output equals the whole run's."""
    from asr.model.encoder import ConvSubsampling
    torch.manual_seed(0)
    for factor, norm in ((2, "pre"), (4, "pre"), (2, "post")):
        encoder = tiny_encoder(subsampling=factor, subsampling_channels=3, layers=2, norm=norm)
        features, lengths = torch.randn(2, 101, 12), torch.tensor([101, 57])
        with torch.no_grad():
            whole, whole_lengths = encoder(features, lengths)
            monkeypatch.setattr(ConvSubsampling, "PIECE_FRAMES", 16)
            monkeypatch.setattr(EncoderLayer, "PIECE_POSITIONS", 8)
            pieces, piece_lengths = encoder(features, lengths)
            monkeypatch.undo()
        assert torch.equal(piece_lengths, whole_lengths)
        for b, n in enumerate(whole_lengths.tolist()):
            torch.testing.assert_close(pieces[b, :n], whole[b, :n], rtol=1e-5, atol=1e-5)

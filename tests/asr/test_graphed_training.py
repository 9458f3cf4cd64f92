"""trainer.cuda_graphs and data.fixed_batch_shapes: the config's rules, the gpu80 trainer preset, a
CPU run with fixed batch shapes (trains as without them, resumes exactly), and - on a GPU - the
graphed encoder against the eager one."""
from __future__ import annotations

import pytest
import torch

from asr.config import schema
from asr.config.schema import validate_config
from asr.core.errors import ConfigError
from asr.model.graphed_encoder import GraphedForward, graph_encoder
from asr.training.fit import train
from test_train import train_losses
from tiny_runs import compose_config, tiny_config

requires_cuda = pytest.mark.skipif(not torch.cuda.is_available(),
                                   reason="no CUDA device (torch.cuda.is_available() is False)")


@pytest.mark.parametrize("overrides, message", [
    (["trainer.cuda_graphs=true", "data.fixed_batch_shapes=true", "trainer.accelerator=cpu"],
     "trainer.cuda_graphs=true captures CUDA graphs, and this run trains on the CPU"),
    (["trainer.cuda_graphs=true", "trainer.accelerator=gpu"], "needs data.fixed_batch_shapes=true"),
    (["trainer.cuda_graphs=true", "data.fixed_batch_shapes=true", "trainer.accelerator=gpu", "trainer.compile=true"],
     "choose one"),
    (["trainer.cuda_graphs=true", "data.fixed_batch_shapes=true", "trainer.accelerator=gpu",
      "trainer.diagnostics_every_n_steps=10"], "forward hooks, which a replayed graph does not call"),
])
def test_cuda_graphs_that_cannot_work_are_refused_with_the_fix(monkeypatch, overrides, message):
    monkeypatch.setattr(schema, "gpu_visible", lambda: True)   # as on a GPU machine: accelerator=gpu passes
    with pytest.raises(ConfigError, match=message):
        validate_config(compose_config(*overrides))


def test_the_gpu80_trainer_preset_sets_graphs_fixed_shapes_and_big_batches_on_any_corpus(monkeypatch):
    monkeypatch.setattr(schema, "gpu_visible", lambda: True)   # as on a GPU machine
    for preset, corpus in (("wsj_iclustered", "wsj"), ("synth_iclustered", "synth")):
        cfg = compose_config(f"conf={preset}", "trainer=gpu80")
        assert cfg.data.corpus == corpus and cfg.attention.name == "iclustered"
        assert cfg.trainer.cuda_graphs and cfg.data.fixed_batch_shapes and cfg.trainer.accelerator == "gpu"
        assert cfg.trainer.precision == "bf16-mixed" and cfg.data.max_duration == 2400.0
        validate_config(cfg)   # where a GPU is visible, nothing refuses the preset
    # fixed shapes alone are for any device
    validate_config(compose_config("data.fixed_batch_shapes=true", "trainer.accelerator=cpu"))


def test_fixed_batch_shapes_train_as_without_them_and_resume_exactly(tiny_synth, tmp_path):
    """Dropout off (its masks are drawn over the padded shape): the same losses with and without
    fixed shapes; and a fixed-shape run stopped after one epoch and resumed takes the losses of
    one that was not stopped."""
    common = ("conf=synth_full", "model.dropout=0.0", "test=false")
    fixed = ("data.fixed_batch_shapes=true",)
    plain, whole, interrupted = tmp_path / "plain", tmp_path / "whole", tmp_path / "interrupted"
    train(tiny_config(tiny_synth, *common, "trainer.max_epochs=2"), plain)
    train(tiny_config(tiny_synth, *common, *fixed, "trainer.max_epochs=2"), whole)
    train(tiny_config(tiny_synth, *common, *fixed, "trainer.max_epochs=1"), interrupted)
    train(tiny_config(tiny_synth, *common, *fixed, "trainer.max_epochs=2", "ckpt_path=last"), interrupted)
    # the fixed-shape batches were padded: rows past their utterances, frames past their longest
    from asr.data.config import DataConfig
    from asr.data.datamodule import SpeechDataModule
    cfg = tiny_config(tiny_synth, *common, *fixed)
    data = SpeechDataModule(DataConfig.of(cfg.data), frame_subsampling=cfg.model.subsampling, seed=cfg.seed)
    data.setup("fit")
    batches = list(data.train_dataloader())
    assert any(len(b["feature_lengths"]) > len(b["ids"]) for b in batches)
    assert all(b["features"].shape[1] % 8 == 0 and b["features"].shape[1] > b["feature_lengths"].max() for b in batches)
    expected, got, resumed = train_losses(plain), train_losses(whole), train_losses(interrupted)
    assert set(got) == set(expected) == set(resumed) and len(expected) >= 2
    for step in expected:
        assert got[step] == pytest.approx(expected[step], rel=1e-4), step
        assert resumed[step] == pytest.approx(got[step], rel=1e-6), step


def test_graphing_keeps_the_state_dict_and_runs_eagerly_off_the_gpu():
    from test_recognizer import UTTERANCES, toy_batch, toy_recognizer
    model = toy_recognizer()
    keys = list(model.state_dict())
    graphed = graph_encoder(model.encoder)
    assert isinstance(graphed, GraphedForward) and graph_encoder(model.encoder) is graphed
    assert list(model.state_dict()) == keys
    batch = toy_batch(UTTERANCES)
    model._losses(batch)[0].backward()     # CPU tensors: the encoder's own forward, no graph
    assert not graphed.graphs


def test_one_graph_per_shape_and_attention_and_the_own_forward_otherwise(monkeypatch, caplog):
    """The bookkeeping around the captures, with a stand-in capture (a real one needs CUDA)."""
    from attention_ext import validate_attention
    from test_recognizer import UTTERANCES, toy_batch, toy_recognizer
    captured = []

    def fake_capture(self, inputs):
        captured.append(tuple(inputs[0].shape))
        return self.eager_forward
    monkeypatch.setattr(GraphedForward, "_on_gpu", staticmethod(lambda inputs: True))
    monkeypatch.setattr(GraphedForward, "_capture", fake_capture)
    model = toy_recognizer()
    graph_encoder(model.encoder, max_graphs=3)
    short, long = toy_batch(UTTERANCES[:2]), toy_batch(UTTERANCES)
    for batch in (short, short, long, short):
        model._losses(batch)[0].backward()
    assert captured == [tuple(short["features"].shape), tuple(long["features"].shape)]
    model.set_attention(validate_attention("iclustered", clusters=4))   # another attention: captured again
    model._losses(short)[0].backward()
    assert len(captured) == 3
    with caplog.at_level("WARNING", logger="asr.model.graphed_encoder"):
        model._losses(long)[0].backward()        # a fourth graph: more than max_graphs, run as it is
        model.eval()
        with torch.no_grad():
            model._losses(toy_batch(UTTERANCES[:3]))
    assert len(captured) == 3 and "more than 3 batch shapes" in caplog.text


# ---- on a GPU ------------------------------------------------------------------------------------
def _encoder_step(encoder, features, lengths):
    encoder.zero_grad(set_to_none=True)
    states, out_lengths = encoder(features, lengths)
    (states.float().square() * torch.arange(states.shape[1], device=states.device)[:, None]).mean().backward()
    return states.detach().clone(), out_lengths.clone(), {n: p.grad.clone() for n, p in encoder.named_parameters()}


@requires_cuda
@pytest.mark.parametrize("attention", ["full", "clustered"])
def test_the_graphed_encoder_replays_new_batches_as_the_eager_one_computes_them(attention):
    from asr.model.encoder import TransformerEncoder
    from attention_ext import validate_attention
    spec = validate_attention("full") if attention == "full" else validate_attention("clustered", clusters=200)
    torch.manual_seed(0)
    encoder = TransformerEncoder(40, layers=2, heads=2, head_dim=16, ff_dim=64, dropout=0.0, subsampling=2,
                                 subsampling_channels=4, shared_qk=False, positions="sinusoidal", norm="pre", input_norm=False,
                                 attention=spec).cuda().train()
    eager = {}
    batches = [(torch.randn(3, t, 40, device="cuda"), torch.tensor([t, t - 7, 1], device="cuda"))
               for t in (64, 64, 96, 64)]
    for index, (features, lengths) in enumerate(batches):
        eager[index] = _encoder_step(encoder, features, lengths)
    graphed = graph_encoder(encoder)
    for index, (features, lengths) in enumerate(batches):   # shapes 64, 64 (a replay), 96, 64 again
        states, out_lengths, gradients = _encoder_step(encoder, features, lengths)
        torch.testing.assert_close(states, eager[index][0], rtol=1e-4, atol=1e-5)
        assert torch.equal(out_lengths, eager[index][1])
        for name, gradient in eager[index][2].items():
            torch.testing.assert_close(gradients[name], gradient, rtol=1e-4, atol=1e-5, msg=name)
    assert len(graphed.graphs) == 2
    encoder.eval()
    with torch.no_grad():   # not training: the encoder's own forward, any shape
        encoder(torch.randn(2, 50, 40, device="cuda"), torch.tensor([50, 20], device="cuda"))
    assert len(graphed.graphs) == 2

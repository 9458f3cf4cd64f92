"""Mixed-precision training (trainer.precision) with every attention, on tiny runs."""
from __future__ import annotations

import csv
import math
from pathlib import Path

import pytest
import torch

from asr.config.schema import validate_config
from asr.core.errors import ConfigError
from asr.training.callbacks import EpochTimer
from asr.training.fit import build_trainer, train
from attention_ext import build_attention
from tiny_runs import compose_config, tiny_config

# (preset, extra overrides): the six synth presets, and oracle-top on the full-attention model
ATTENTION_RUNS = [("synth_full", ()), ("synth_shared_full", ()), ("synth_lsh1", ()), ("synth_lsh4", ()),
                  ("synth_clustered", ()), ("synth_iclustered", ()), ("synth_full", ("attention=oracle_top",))]
RUN_IDS = [preset + "".join(f"+{o.split('=')[1]}" for o in extra) for preset, extra in ATTENTION_RUNS]
# two training batches, then the validation of the epoch (also under autocast), no test
SHORT = ("trainer.limit_train_batches=2", "test=false")


class AttentionCalls:
    """Records, for every call of an attention_ext module, its type, the dtype of q, k and v it
    was given and whether its output was finite (a global forward hook, removed on exit)."""

    def __enter__(self):
        self.calls = []
        self._handle = torch.nn.modules.module.register_module_forward_hook(self._hook)
        return self

    def _hook(self, module, inputs, output):
        if type(module).__module__.startswith("attention_ext."):
            q, k, v = inputs[:3]
            self.calls.append((type(module), q.dtype, k.dtype, v.dtype, output.dtype,
                               bool(torch.isfinite(output).all())))

    def __exit__(self, *exc):
        self._handle.remove()


def logged(run_dir: Path, key: str) -> list[float]:
    values = []
    for path in run_dir.glob("logs/version_*/metrics.csv"):
        with open(path) as f:
            values += [float(row[key]) for row in csv.DictReader(f) if row.get(key)]
    return values


@pytest.mark.parametrize("preset, extra", ATTENTION_RUNS, ids=RUN_IDS)
def test_bf16_mixed_trains_every_attention_in_bfloat16(preset, extra, tiny_synth, tmp_path):
    cfg = tiny_config(tiny_synth, f"conf={preset}", *extra, "trainer.precision=bf16-mixed", *SHORT)
    with AttentionCalls() as recorded:
        results = train(cfg, tmp_path / "run")
    expected_type = type(build_attention(cfg.attention.name))
    assert results["steps"] == 2 and recorded.calls
    for attention_type, q, k, v, out, finite in recorded.calls:
        # autocast ran the projections in bfloat16, so the attention got bfloat16 inputs
        assert attention_type is expected_type
        assert q == k == v == out == torch.bfloat16 and finite
    losses = logged(tmp_path / "run", "train/loss")
    assert len(losses) == 2 and all(math.isfinite(loss) for loss in losses)
    assert math.isfinite(logged(tmp_path / "run", "val/loss")[-1]) and 0 <= results["val"]["per"] < 10
    # mixed precision keeps float32 weights
    checkpoint = torch.load(tmp_path / "run" / "checkpoints" / "last.ckpt", map_location="cpu", weights_only=True)
    assert {tensor.dtype for tensor in checkpoint["state_dict"].values()} == {torch.float32}


def has_cuda_kernels(attention: str) -> bool:
    """Whether attention_ext was built with CUDA kernels for this attention (the pure-torch ones need none)."""
    operator = {"clustered": "hyperplane_hash", "iclustered": "hyperplane_hash", "lsh": "lsh_hash"}.get(attention)
    return operator is None or torch._C._dispatch_has_kernel_for_dispatch_key(f"attention_ext::{operator}", "CUDA")


@pytest.mark.skipif(not torch.cuda.is_available(), reason="16-mixed (float16 autocast) needs a CUDA GPU")
@pytest.mark.parametrize("preset, extra", ATTENTION_RUNS, ids=RUN_IDS)
def test_16_mixed_trains_every_attention_on_a_gpu(preset, extra, tiny_synth, tmp_path):
    cfg = tiny_config(tiny_synth, f"conf={preset}", *extra, "trainer.precision=16-mixed",
                      "trainer.accelerator=gpu", "trainer.devices=1", *SHORT)
    if not has_cuda_kernels(cfg.attention.name):
        pytest.skip(f"attention_ext has no CUDA kernels for {cfg.attention.name}")
    with AttentionCalls() as recorded:
        results = train(cfg, tmp_path / "run")
    assert results["steps"] == 2 and recorded.calls
    assert all(q == torch.float16 and finite for _, q, _, _, _, finite in recorded.calls)
    assert all(math.isfinite(loss) for loss in logged(tmp_path / "run", "train/loss"))


def test_16_mixed_on_the_cpu_is_refused_with_the_alternative():
    # Lightning would quietly switch to bf16-mixed; asr.train says so before anything runs
    with pytest.raises(ConfigError, match=r"trainer.precision='16-mixed' is not allowed: float16 mixed precision "
                                          r"needs a GPU.*use trainer.precision=bf16-mixed"):
        validate_config(compose_config("trainer.precision=16-mixed", "trainer.accelerator=cpu"))
    if not torch.cuda.is_available():   # auto resolves to the CPU here
        with pytest.raises(ConfigError, match="trainer.accelerator=auto"):
            validate_config(compose_config("trainer.precision=16-mixed"))


def test_deterministic_training_on_a_gpu_is_refused():
    # torch's deterministic mode has no CTC backward on CUDA: refused before anything runs
    with pytest.raises(ConfigError, match=r"trainer.deterministic=True is not allowed: PyTorch has no "
                                          r"deterministic CTC loss backward on a GPU.*trainer.accelerator=gpu"):
        validate_config(compose_config("trainer.deterministic=true", "trainer.accelerator=gpu"))
    validate_config(compose_config("trainer.deterministic=true", "trainer.accelerator=cpu"))


@pytest.mark.parametrize("override, message", [
    ("trainer.precision=bf16-true", r"trainer.precision='bf16-true' is not allowed: choose one of 32-true, "
                                    r"bf16-mixed, 16-mixed"),
    ("trainer.num_nodes=0", "trainer.num_nodes=0 is not allowed: must be >= 1"),
])
def test_bad_precision_and_node_count_are_refused(override, message):
    with pytest.raises(ConfigError, match=message):
        validate_config(compose_config(override))


def test_num_nodes_reaches_the_trainer(tmp_path):
    cfg = compose_config("trainer.num_nodes=3", "trainer.accelerator=cpu", "trainer.devices=2",
                         "trainer.strategy=ddp", "trainer.precision=bf16-mixed")
    validate_config(cfg)
    trainer, _, _ = build_trainer(cfg, tmp_path, EpochTimer())
    assert trainer.num_nodes == 3 and trainer.num_devices == 2 and trainer.precision == "bf16-mixed"

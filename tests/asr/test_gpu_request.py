"""trainer.accelerator=gpu where torch sees no GPU (a CPU torch, or a container started without
`--gpus all`): asr.train's config check stops with one line naming the option and the cause, before
any data is loaded (Lightning's own error comes later, as a traceback)."""
from __future__ import annotations

import pytest
import torch
from tiny_runs import compose_config

from asr.config import schema
from asr.config.schema import validate_config
from asr.core.errors import ConfigError


@pytest.mark.parametrize("accelerator", ["gpu", "cuda", "GPU"])
def test_a_gpu_asked_for_and_missing_is_one_line_naming_the_cause(monkeypatch, accelerator):
    monkeypatch.setattr(schema, "gpu_visible", lambda: False)
    monkeypatch.setattr(torch.version, "cuda", "13.0")   # a CUDA torch in a container without GPUs
    with pytest.raises(ConfigError) as error:
        validate_config(compose_config("conf=synth_iclustered", f"trainer.accelerator={accelerator}"))
    message = str(error.value)
    assert "\n" not in message
    assert message.startswith(f"trainer.accelerator='{accelerator}' is not allowed: no CUDA GPU is visible")
    assert "--gpus all" in message and "trainer.accelerator=auto" in message


def test_a_cpu_torch_is_named_as_the_cause(monkeypatch):
    monkeypatch.setattr(schema, "gpu_visible", lambda: False)
    monkeypatch.setattr(torch.version, "cuda", None)
    with pytest.raises(ConfigError, match=r"\(torch \S+ is a CPU build\); use trainer.accelerator=auto or cpu"):
        validate_config(compose_config("trainer.accelerator=gpu"))


@pytest.mark.parametrize("accelerator", ["auto", "cpu"])
def test_auto_and_cpu_need_no_gpu(monkeypatch, accelerator):
    monkeypatch.setattr(schema, "gpu_visible", lambda: False)
    validate_config(compose_config(f"trainer.accelerator={accelerator}"))


def test_a_visible_gpu_passes(monkeypatch):
    monkeypatch.setattr(schema, "gpu_visible", lambda: True)
    validate_config(compose_config("trainer.accelerator=gpu"))

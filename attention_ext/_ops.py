"""Loads the compiled kernels; `ops` is torch.ops.attention_ext."""
import torch

try:
    # Loading the compiled module registers the operators; the switch is contract.set_input_validation's.
    from ._C import set_device_value_checks  # noqa: F401
except ImportError as error:  # pragma: no cover - only on an unbuilt checkout
    raise ImportError(
        "attention_ext's compiled kernels (attention_ext._C) are not built or do not match "
        "the installed torch. From the project root run: "
        "`pip install --no-build-isolation -e .` (see README.md)") from error

from . import _fake_kernels  # noqa: E402,F401  (fake implementations for torch.compile)

ops = torch.ops.attention_ext

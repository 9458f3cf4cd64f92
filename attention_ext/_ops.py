"""Loads the compiled kernels; `ops` is torch.ops.attention_ext."""
import torch

try:
    from attention_ext import _C  # noqa: F401  (loading it registers the operators)
    from attention_ext._C import set_device_value_checks  # noqa: F401  (contract.set_input_validation)
except ImportError as error:  # pragma: no cover - only on an unbuilt checkout
    raise ImportError(
        "attention_ext's compiled kernels (attention_ext._C) are not built or do not match "
        "the installed torch. From the project root run: "
        "`pip install --no-build-isolation -e .` (see README.md)") from error

from attention_ext import _fake_kernels  # noqa: E402,F401  (fake implementations for torch.compile)

ops = torch.ops.attention_ext

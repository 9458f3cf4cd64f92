"""Triton kernels for the CUDA route of clustered and i-clustered attention (few launches per
attention call): the whole query clustering in one launch (clustering.py) and i-clustered's
top-key attention in one launch each way (top_attention.py). Triton is optional: without it
(`TRITON_AVAILABLE` False) CUDA keeps the extension's kernels, and the CPU route never needs it.
attentions/clustered.py's `kernel_routes` chooses between them.

Why Triton and not more CUDA C++: a (batch, head)'s whole clustering as one program is a few dozen
lines of tensor code here (popcount distances, the members' bit counts as one product of 0/1
matrices on tensor cores through tl.dot), and Triton's interpreter (TRITON_INTERPRET=1) runs the
same kernels on the CPU, so CI tests them against the extension's kernels and dense math, and
compiles the attentions with torch.compile, without a GPU. The launches sit in opaque custom
operators, as the extension's kernels do. attention_ext/README.md, "The CUDA route of clustered and
i-clustered", says more.
"""
import importlib.util
import os

# Looked up, not imported: importing triton costs a second that a CPU run never needs.
TRITON_AVAILABLE = importlib.util.find_spec("triton") is not None


def triton_interpreted() -> bool:
    """Whether Triton kernels defined now run in its interpreter (on CPU tensors only; compiled
    kernels take CUDA tensors only). Triton reads TRITON_INTERPRET when a kernel is defined."""
    return os.environ.get("TRITON_INTERPRET", "0") == "1"

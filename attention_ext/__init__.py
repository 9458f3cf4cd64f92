"""attention_ext: fast attention kernels (C++ for CPU, CUDA for GPU) behind one contract.

    from attention_ext import build_attention
    attn = build_attention("iclustered", clusters=100, topk=32)
    out = attn(q, k, v, lengths)    # q, k, v: (B, H, N, E); lengths: (B,) or None

The package knows nothing about speech. See README.md for the list of attention
types and their options.
"""
import importlib
import pkgutil

from .registry import (AttentionConfigError, Option, SharedQKRequiredError, ValidatedAttention,
                       available_attentions, build_attention, describe_attentions,
                       parse_attention_spec, register_attention, validate_attention)
from .contract import input_validation_enabled, set_input_validation

# Importing the modules of attentions/ registers their attention types. The imports below keep the
# order the registry lists them in (the order they joined the project, which is the order of the
# comparisons' further rows, attention_ext.comparisons).
from .attentions.full import FullAttention  # noqa: E402
from .attentions.shared_full import SharedFullAttention  # noqa: E402
from .attentions.lsh import LSHAttention  # noqa: E402
from .attentions.oracle_top import OracleTopAttention  # noqa: E402
from .attentions.clustered import ClusteredAttention  # noqa: E402
from .attentions.iclustered import ImprovedClusteredAttention  # noqa: E402
from .attentions.linear import LinearAttention  # noqa: E402
from .attentions.agglomerative import AgglomerativeAttention  # noqa: E402
from .attentions.reformer_key_form import build_in_reformer_form, runs_in_reformer_form  # noqa: E402
from . import attentions  # noqa: E402

# Every other module of attentions/ is imported too, so that a new attention type registers itself
# by being a module there; it registers after the ones above, in name order. Only that folder is
# walked: the package's tools (benchmarks/) are never imported by `import attention_ext`.
for _module in pkgutil.iter_modules(attentions.__path__):
    if not _module.ispkg and not _module.name.startswith("_"):
        importlib.import_module(f"{attentions.__name__}.{_module.name}")

__all__ = [
    "AttentionConfigError", "Option", "SharedQKRequiredError", "ValidatedAttention",
    "available_attentions", "build_attention", "describe_attentions", "parse_attention_spec",
    "register_attention", "validate_attention", "input_validation_enabled", "set_input_validation",
    "FullAttention", "SharedFullAttention", "LSHAttention", "OracleTopAttention",
    "ClusteredAttention", "ImprovedClusteredAttention", "LinearAttention", "AgglomerativeAttention",
    "build_in_reformer_form", "runs_in_reformer_form",
]

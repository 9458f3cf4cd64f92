"""The attention an evaluation runs with: the trained one, or a spec and options swapped in, checked
against the model once here; and the key form a shared-QK model gives it."""
from __future__ import annotations

from typing import Any

from asr.core.errors import EvaluationError
from asr.model.encoder import check_attention_fits
from asr.model.recognizer import SpeechRecognizer
from attention_ext import (AttentionConfigError, ValidatedAttention, parse_attention_spec, runs_in_reformer_form,
                           validate_attention)

def evaluation_attention(model: SpeechRecognizer, spec: str | None,
                         options: dict[str, Any] | None = None) -> ValidatedAttention:
    """The attention to evaluate with: `spec` plus `options`, or the training attention when
    both are empty; options alone modify the training attention (e.g. more clusters). Checked
    here, once, against the model (check_attention_fits): the encoder takes it as it is."""
    base = parse_attention_spec(spec) if spec is not None else validate_attention(**model.hparams.attention)
    attention = base
    if options:
        merged = dict(base.options)
        for key, value in options.items():
            try:
                merged[key] = int(value)
            except (TypeError, ValueError):
                raise AttentionConfigError(f"attention.{key}={value!r} is not a whole number") from None
        attention = validate_attention(base.name, **merged)
    check_attention_fits(attention, model.encoder.shared_qk, model.encoder.head_dim)
    return attention


# shared_qk_keys=...: the keys a shared-QK model gets from attentions defined for separate keys
# (full, clustered, iclustered, oracle_top). A model trained with shared_full or lsh learned the
# Reformer conventions (unit-normalised keys, no attention to self unless nothing else), which
# those attentions then follow (attention_ext.reformer_key_form); "raw" gives them keys equal to
# the raw queries, self allowed, as every evaluation did before issue 31.
SHARED_QK_KEYS = {"trained": "the key form the model was trained with",
                  "raw": "keys equal to the raw queries, attention to self allowed"}
# What the attention of an evaluation saw as keys (results.json and cross-matrix cells: key_form)
KEY_FORMS = {"separate": "the key projection (no shared QK)",
             "reformer": "unit-normalised queries, no attention to self (Reformer)",
             "queries": "the raw queries, attention to self allowed"}


def check_shared_qk_keys(value: str, option: str = "shared_qk_keys") -> None:
    """EvaluationError naming `option` unless `value` is one of SHARED_QK_KEYS."""
    if value not in SHARED_QK_KEYS:
        choices = "; ".join(f"{name} ({meaning})" for name, meaning in SHARED_QK_KEYS.items())
        raise EvaluationError(f"{option}={value!r} is not a key form; choose {choices}")


def evaluation_key_form(shared_qk: bool, trained_attention: str, attention: ValidatedAttention,
                        shared_qk_keys: str) -> str:
    """The KEY_FORMS entry `attention` runs with on a model with or without shared QK trained with
    `trained_attention`, under shared_qk_keys (SHARED_QK_KEYS)."""
    if not shared_qk:
        return "separate"
    if attention.needs_shared_qk:       # shared_full, lsh: the Reformer conventions are their definition
        return "reformer"
    trained_reformer = validate_attention(trained_attention).needs_shared_qk
    if shared_qk_keys == "trained" and trained_reformer and runs_in_reformer_form(attention.name):
        return "reformer"
    return "queries"


def set_evaluation_attention(model: SpeechRecognizer, attention: ValidatedAttention, shared_qk_keys: str,
                             layers: list[int] | None = None) -> str:
    """Swaps `attention` into the model (every layer, or the `layers` given) in the key form
    shared_qk_keys asks for; returns that form (KEY_FORMS). Refuses, changing nothing, what
    model.set_attention refuses."""
    key_form = evaluation_key_form(model.encoder.shared_qk, model.hparams.attention["name"], attention,
                                   shared_qk_keys)
    model.set_attention(attention, reformer_keys=key_form == "reformer", layers=layers)
    return key_form


def attention_label(name: str, options: dict[str, int]) -> str:
    """'iclustered' + {clusters: 64, ...} -> 'iclustered_clusters64_bits63_...' (a folder name)."""
    return "_".join([name] + [f"{key}{value}" for key, value in sorted(options.items())])

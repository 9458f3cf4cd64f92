"""Names -> attention types, with their options validated at build time.

    attn = build_attention("iclustered", clusters=100, topk=32)

An attention type registers itself with `@register_attention(name, options)`;
`build_attention` rejects an unknown name or option, or a bad value, with a
message that lists what is allowed. This is the one place that turns a config
into an attention module.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch


class AttentionConfigError(ValueError):
    """An unknown attention name, an unknown option, or an option value out of range."""


@dataclass(frozen=True)
class Option:
    """One option of an attention type: an int with a default and an allowed range."""
    name: str
    default: int
    minimum: int
    maximum: int | None = None
    help: str = ""

    def rule(self) -> str:
        upper = "" if self.maximum is None else f"..{self.maximum}"
        bound = f"{self.minimum}{upper}" if upper else f">= {self.minimum}"
        return f"{self.name}: int {bound} (default {self.default}){' - ' + self.help if self.help else ''}"

    def validate(self, attention: str, value) -> int:
        if isinstance(value, bool) or not isinstance(value, int):
            if isinstance(value, float) and value.is_integer():
                value = int(value)
            else:
                raise AttentionConfigError(
                    f"attention '{attention}': option {self.name}={value!r} must be an integer; "
                    f"allowed: {self.rule()}")
        if value < self.minimum or (self.maximum is not None and value > self.maximum):
            raise AttentionConfigError(
                f"attention '{attention}': option {self.name}={value} is out of range; "
                f"allowed: {self.rule()}")
        return value


@dataclass(frozen=True)
class AttentionType:
    name: str
    cls: type
    options: tuple[Option, ...]
    summary: str


_REGISTRY: dict[str, AttentionType] = {}


def register_attention(name: str, options: tuple[Option, ...] = (), summary: str = ""
                       ) -> Callable[[type], type]:
    """Class decorator: makes `cls` buildable as `build_attention(name, **options)`."""
    def decorate(cls: type) -> type:
        if name in _REGISTRY:
            raise RuntimeError(f"attention '{name}' is registered twice")
        _REGISTRY[name] = AttentionType(name, cls, tuple(options), summary or (cls.__doc__ or "").strip().split("\n")[0])
        cls.attention_name = name
        return cls
    return decorate


def available_attentions() -> dict[str, AttentionType]:
    """The registered types by name (a copy)."""
    return dict(_REGISTRY)


def describe_attentions() -> str:
    """A human-readable list of the names and their options, for error messages and --help."""
    lines = []
    for entry in _REGISTRY.values():
        rules = "; ".join(option.rule() for option in entry.options) or "no options"
        lines.append(f"  {entry.name}: {rules}")
    return "\n".join(lines)


def resolve_options(name: str, **options) -> dict[str, int]:
    """Validates `options` for attention `name` and fills in the defaults."""
    if name not in _REGISTRY:
        raise AttentionConfigError(
            f"unknown attention '{name}'; allowed names and options:\n{describe_attentions()}")
    entry = _REGISTRY[name]
    known = {option.name: option for option in entry.options}
    unknown = sorted(set(options) - set(known))
    if unknown:
        allowed = ", ".join(known) or "none"
        raise AttentionConfigError(
            f"attention '{name}' has no option {', '.join(unknown)}; its options are: {allowed}\n"
            + "\n".join("  " + option.rule() for option in entry.options))
    resolved = {option.name: option.default for option in entry.options}
    for key, value in options.items():
        resolved[key] = known[key].validate(name, value)
    return resolved


def build_attention(name: str, **options) -> torch.nn.Module:
    """Builds the attention module `name` with validated `options`."""
    resolved = resolve_options(name, **options)
    return _REGISTRY[name].cls(**resolved)

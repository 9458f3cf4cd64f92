"""Names -> attention types, with their options validated at build time.

    attn = build_attention("iclustered", clusters=100, topk=32)

An attention type registers itself with `@register_attention(name, options)`;
`build_attention` rejects an unknown name or option, or a bad value, with a
message that lists what is allowed. This is the one place that turns a config
into an attention module.
"""
from __future__ import annotations

import re
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
    # True for attentions defined only for shared query/key projections: call them with k = q.
    needs_shared_qk: bool = False


_REGISTRY: dict[str, AttentionType] = {}


def register_attention(name: str, options: tuple[Option, ...] = (), summary: str = "",
                       needs_shared_qk: bool = False) -> Callable[[type], type]:
    """Class decorator: makes `cls` buildable as `build_attention(name, **options)`.

    `needs_shared_qk`: the attention refuses a separate key tensor (callers pass k = q)."""
    def decorate(cls: type) -> type:
        if name in _REGISTRY:
            raise RuntimeError(f"attention '{name}' is registered twice")
        _REGISTRY[name] = AttentionType(name, cls, tuple(options), summary or (cls.__doc__ or "").strip().split("\n")[0],
                                        needs_shared_qk)
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


# The option that the number in a short spec sets ("lsh-4" -> rounds=4). A new
# attention type that wants a short numeric form adds its entry here.
SPEC_NUMBER_OPTION: dict[str, str] = {
    "clustered": "clusters",
    "iclustered": "clusters",
    "lsh": "rounds",
    "oracle_top": "topk",
}

# Spellings people use for a registered name, after lower-casing and "-" -> "_".
SPEC_NAME_ALIASES: dict[str, str] = {
    "i_clustered": "iclustered",
    "improved_clustered": "iclustered",
}

_SPEC_PATTERN = re.compile(
    r"^(?P<name>[a-z][a-z0-9_-]*?)(?:[-_](?P<number>\d+))?(?::(?P<settings>.*))?$")


def accepted_spec_forms() -> str:
    """The spec grammar and the forms of the registered attentions, for help and errors."""
    lines = ["  spec = name[-number][:option=<int>,...]; '-' and '_' are interchangeable"]
    for name, entry in _REGISTRY.items():
        forms = [name]
        number_option = SPEC_NUMBER_OPTION.get(name)
        if number_option and any(option.name == number_option for option in entry.options):
            forms.append(f"{name}-<{number_option}>")
        aliases = [alias.replace("_", "-") for alias, target in SPEC_NAME_ALIASES.items()
                   if target == name]
        also = f" (also written {', '.join(aliases)})" if aliases else ""
        options = ", ".join(option.name for option in entry.options) or "none"
        lines.append(f"  {', '.join(forms)}{also}; options: {options}")
    return "\n".join(lines)


def parse_attention_spec(spec: str) -> tuple[str, dict[str, int]]:
    """Turns a short attention spec into a registered name and its full, validated options.

    Grammar (case-insensitive, surrounding spaces ignored):

        spec     := name [ "-" number ] [ ":" setting { "," setting } ]
        setting  := option "=" integer

    - `name` is a registered name; "-" and "_" are interchangeable ("shared-full" is
      "shared_full", "oracle-top" is "oracle_top"), and "i-clustered" (or
      "improved-clustered") is "iclustered".
    - `number` sets the attention's main option (SPEC_NUMBER_OPTION): clusters for
      clustered and iclustered ("clustered-100", "i-clustered-200"), rounds for lsh
      ("lsh-4"), topk for oracle_top ("oracle-top-16"). Attentions without a main
      option (full, shared_full) take no number.
    - `setting`s set any other option: "iclustered-100:topk=16,bits=32",
      "lsh-4:chunk_size=64". A setting may not repeat the option the number set.
    - Options not given keep the registered defaults (the paper's settings).

    Returns (name, options) with every option of the type filled in, so
    `build_attention(name, **options)` builds it and a caller can print exactly
    what runs. An unknown spec, option or value raises AttentionConfigError that
    lists the accepted forms.
    """
    text = spec.strip().lower() if isinstance(spec, str) else ""
    match = _SPEC_PATTERN.match(text)
    name = None
    if match:
        name = match["name"].replace("-", "_")
        name = SPEC_NAME_ALIASES.get(name, name)
    if name not in _REGISTRY:
        raise AttentionConfigError(
            f"unknown attention spec {spec!r}; accepted forms:\n{accepted_spec_forms()}")

    options: dict[str, int] = {}
    if match["number"] is not None:
        number_option = SPEC_NUMBER_OPTION.get(name)
        known = {option.name for option in _REGISTRY[name].options}
        if number_option is None or number_option not in known:
            raise AttentionConfigError(
                f"attention spec {spec!r}: '{name}' takes no number; accepted forms:\n"
                f"{accepted_spec_forms()}")
        options[number_option] = int(match["number"])
    if match["settings"] is not None:
        for setting in match["settings"].split(","):
            key, equals, value = (part.strip() for part in setting.partition("="))
            if not equals or not key or not re.fullmatch(r"[+-]?\d+", value):
                raise AttentionConfigError(
                    f"attention spec {spec!r}: setting {setting.strip()!r} is not option=<integer>; "
                    f"accepted forms:\n{accepted_spec_forms()}")
            if key in options:
                raise AttentionConfigError(
                    f"attention spec {spec!r}: option {key} is given twice")
            options[key] = int(value)
    return name, resolve_options(name, **options)

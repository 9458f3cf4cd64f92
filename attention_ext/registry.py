"""Names -> attention types, with what the rest of the code needs to know about each.

    attn = build_attention("iclustered", clusters=100, topk=32)

An attention type registers itself with `@register_attention(name, options, ...)`,
declaring there every fact about it: its options, whether it needs shared
query/key projections, its short spec spellings, and the spec with which it joins
the project's comparisons (`compare_as`, read by attention_ext.comparisons). Nothing
else keeps a list of attention names. `validate_attention` (and `parse_attention_spec` for short
specs) rejects an unknown name or option, or a bad value, with a message that
lists what is allowed, and returns a `ValidatedAttention`, which builds the
module.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Callable, NamedTuple

import torch


class AttentionConfigError(ValueError):
    """An unknown attention name, an unknown option, or an option value out of range."""


class SharedQKRequiredError(AttentionConfigError):
    """An attention registered with needs_shared_qk, given separate queries and keys (or a
    model without shared query/key projections)."""


# The largest value of any option (a larger Python int failed inside a kernel's argument conversion,
# or overflowed a size computed from it): what every kernel takes as a 32-bit count.
OPTION_LIMIT = 2**31 - 1


@dataclass(frozen=True)
class Option:
    """One option of an attention type: an int with a default, an allowed range and, optionally,
    a step (`multiple_of`)."""
    name: str
    default: int
    minimum: int
    maximum: int | None = None
    help: str = ""
    # The value may not exceed the head dim E of q (known only where a model or a call fixes
    # it): checked by ValidatedAttention.check_head_dim and by the module at each call.
    at_most_head_dim: bool = False
    # The value must be a multiple of this (LSH's bucket cap: buckets come in +/- pairs).
    multiple_of: int = 1

    def rule(self) -> str:
        upper = "" if self.maximum is None else f"..{self.maximum}"
        bound = f"{self.minimum}{upper}" if upper else f">= {self.minimum}"
        if self.multiple_of > 1:
            bound += f", a multiple of {self.multiple_of}"
        if self.at_most_head_dim:
            bound += ", <= head dim"
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
        if value > OPTION_LIMIT:
            raise AttentionConfigError(
                f"attention '{attention}': option {self.name}={value} is out of range; at most {OPTION_LIMIT} "
                f"(the largest the kernels take); allowed: {self.rule()}")
        if value % self.multiple_of:
            raise AttentionConfigError(
                f"attention '{attention}': option {self.name}={value} is not a multiple of {self.multiple_of}; "
                f"allowed: {self.rule()}")
        return value


@dataclass(frozen=True)
class AttentionType:
    """A registered attention type and everything declared about it."""
    name: str
    cls: type
    options: tuple[Option, ...]
    summary: str
    needs_shared_qk: bool      # only defined for k = q (a model with shared query/key projections)
    aliases: tuple[str, ...]   # other spellings of the name in a spec ("i-clustered")
    number_option: str | None  # the option a spec's number sets ("lsh-4" -> rounds=4)
    compare_as: str | None     # the spec it joins the comparisons with (attention_ext.comparisons)
    quadratic_time: bool       # its time grows with the square of the length (else linearly)


_REGISTRY: dict[str, AttentionType] = {}


def _spec_word(text: str) -> str:
    """A name as specs compare it: lower case, "-" and "_" alike."""
    return text.strip().lower().replace("-", "_")


def register_attention(name: str, options: tuple[Option, ...] = (), summary: str = "", *,
                       needs_shared_qk: bool = False, aliases: tuple[str, ...] = (),
                       number_option: str | None = None,
                       compare_as: str | None = None, quadratic_time: bool = False) -> Callable[[type], type]:
    """Class decorator: makes `cls` buildable as `build_attention(name, **options)`.

    needs_shared_qk: the attention is only defined when k is q; it is refused for a separate
    key tensor and for a model without shared query/key projections.
    aliases: further spellings of the name in a spec, e.g. ("i-clustered",).
    number_option: the option a spec's number sets, e.g. "rounds" for "lsh-4".
    compare_as: the spec with which this attention joins every comparison of the project
    (benchmark, copy task, asr.cross_matrix's rows, the synth experiment), after the paper's
    attentions: e.g. "agglomerative-8". None (the default): it is in none of them.
    quadratic_time: its time grows with the square of the sequence length (every score computed);
    the default is linear. What a caller estimates a long run's time from (asr.transcribe's one pass).
    """
    def decorate(cls: type) -> type:
        if name in _REGISTRY:
            raise RuntimeError(f"attention '{name}' is registered twice")
        taken = {_spec_word(spelling) for entry in _REGISTRY.values() for spelling in (entry.name, *entry.aliases)}
        for spelling in (name, *aliases):
            if _spec_word(spelling) in taken:
                raise RuntimeError(f"attention '{name}': {spelling!r} already names an attention in a spec")
        if number_option is not None and number_option not in {option.name for option in options}:
            raise RuntimeError(f"attention '{name}': number_option {number_option!r} is none of its options")
        _REGISTRY[name] = AttentionType(
            name, cls, tuple(options), summary or (cls.__doc__ or "").strip().split("\n")[0],
            needs_shared_qk, tuple(aliases), number_option, compare_as, quadratic_time)
        if compare_as is not None:
            _check_compare_as(name, compare_as)
        cls.attention_name = name
        cls.needs_shared_qk = needs_shared_qk
        return cls
    return decorate


def _check_compare_as(name: str, spec: str) -> None:
    """Unregisters `name` and raises when its compare_as is not a valid spec of itself: a
    mistake in the declaration fails at import, not in the middle of a comparison."""
    try:
        compared = parse_attention_spec(spec).name
    except AttentionConfigError as error:
        del _REGISTRY[name]
        raise RuntimeError(f"attention '{name}': compare_as {spec!r} is not a valid spec: {error}") from None
    if compared != name:
        del _REGISTRY[name]
        raise RuntimeError(f"attention '{name}': compare_as {spec!r} names '{compared}', not '{name}'")


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


# Options are validated once, where they enter: a config, a spec, a library call. What that
# check returns, a ValidatedAttention, is the proof, so code that holds one builds it without
# checking again. `build_attention(name, **options)` is the library's entry point for a plain
# name and options, which it cannot trust, so it validates them itself.
class ValidatedAttention(NamedTuple):
    """A registered attention name with all its options, checked and defaults filled in.

    Made by `validate_attention` or `parse_attention_spec`; unpacks as (name, options).
    """
    name: str
    options: dict[str, int]

    @property
    def needs_shared_qk(self) -> bool:
        return _REGISTRY[self.name].needs_shared_qk

    def check_head_dim(self, head_dim: int) -> None:
        """Refuses an option declared at_most_head_dim whose value exceeds `head_dim`."""
        check_options_fit_head_dim(self.name, self.options, head_dim)

    def as_config(self) -> dict:
        """{"name": name, **options}: the form of a config's attention node."""
        return {"name": self.name, **self.options}

    def build(self) -> torch.nn.Module:
        return _REGISTRY[self.name].cls(**self.options)


def check_options_fit_head_dim(name: str, options: dict[str, int], head_dim: int) -> None:
    """Raises AttentionConfigError when an option of `name` declared at_most_head_dim exceeds
    `head_dim` (for a model: its head_dim; for a call: the last dim of q)."""
    for option in _REGISTRY[name].options:
        value = options.get(option.name, option.default)
        if option.at_most_head_dim and value > head_dim:
            raise AttentionConfigError(
                f"attention '{name}': option {option.name}={value} exceeds the head dim {head_dim}; "
                f"it must be at most the head dim (lower {option.name}, or use a model with "
                f"model.head_dim >= {value})")


def validate_attention(name: str, **options) -> ValidatedAttention:
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
    return ValidatedAttention(name, resolved)


def build_attention(name: str, **options) -> torch.nn.Module:
    """Builds the attention module `name` with validated `options`."""
    return validate_attention(name, **options).build()


_SPEC_PATTERN = re.compile(
    r"^(?P<name>[a-z][a-z0-9_-]*?)(?:[-_](?P<number>\d+))?(?::(?P<settings>.*))?$")


def _spec_name(word: str) -> str | None:
    """The registered name a spec's name part stands for (the name itself or an alias), or None."""
    word = _spec_word(word)
    if word in _REGISTRY:
        return word
    return next((entry.name for entry in _REGISTRY.values()
                 if word in (_spec_word(alias) for alias in entry.aliases)), None)


def accepted_spec_forms() -> str:
    """The spec grammar and the forms of the registered attentions, for help and errors."""
    lines = ["  spec = name[-number][:option=<int>,...]; '-' and '_' are interchangeable"]
    for name, entry in _REGISTRY.items():
        forms = [name]
        if entry.number_option:
            forms.append(f"{name}-<{entry.number_option}>")
        also = f" (also written {', '.join(entry.aliases)})" if entry.aliases else ""
        options = ", ".join(option.name for option in entry.options) or "none"
        lines.append(f"  {', '.join(forms)}{also}; options: {options}")
    return "\n".join(lines)


def parse_attention_spec(spec: str) -> ValidatedAttention:
    """Turns a short attention spec into a registered name and its full, validated options.

    Grammar (case-insensitive, surrounding spaces ignored):

        spec     := name [ "-" number ] [ ":" setting { "," setting } ]
        setting  := option "=" integer

    - `name` is a registered name or one of its aliases; "-" and "_" are interchangeable
      ("shared-full" is "shared_full", "oracle-top" is "oracle_top"), and "i-clustered"
      (or "improved-clustered") is "iclustered".
    - `number` sets the attention's main option (its number_option): clusters for
      clustered and iclustered ("clustered-100", "i-clustered-200"), rounds for lsh
      ("lsh-4"), topk for oracle_top ("oracle-top-16"). Attentions without a main
      option (full, shared_full) take no number.
    - `setting`s set any other option: "iclustered-100:topk=16,bits=32",
      "lsh-4:chunk_size=64". A setting may not repeat the option the number set.
    - Options not given keep the registered defaults (the paper's settings).

    Returns the ValidatedAttention (name, options) with every option of the type
    filled in, so its `build()` makes the module and a caller can print exactly
    what runs. An unknown spec, option or value raises AttentionConfigError that
    lists the accepted forms.
    """
    text = spec.strip().lower() if isinstance(spec, str) else ""
    match = _SPEC_PATTERN.match(text)
    name = _spec_name(match["name"]) if match else None
    if name is None:
        raise AttentionConfigError(
            f"unknown attention spec {spec!r}; accepted forms:\n{accepted_spec_forms()}")

    options: dict[str, int] = {}
    if match["number"] is not None:
        number_option = _REGISTRY[name].number_option
        if number_option is None:
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
    return validate_attention(name, **options)

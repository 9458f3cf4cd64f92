"""Misspelt command-line arguments, named: "did you mean conf=wsj_iclustered?" in one line.

Hydra answers a misspelt preset by listing all of them, and a misspelt key by suggesting to add
it with `+` (which the closed schema then refuses); OmegaConf's dotlist commands (asr.evaluate,
asr.transcribe, asr.tune_lm) list every argument. These checks find the one name that was meant
(difflib, asr.core.errors.closest_name) and say it. They only ever speak when a close match exists: an argument that is not a
near miss of a known name is left to Hydra / OmegaConf, whose messages stay as they were.
"""
from __future__ import annotations

import sys
from pathlib import Path
from typing import Sequence

from asr.core.errors import closest_name

CONF_DIR = Path(__file__).resolve().parents[2] / "conf"   # asr.train's config_path="../conf"


def group_options(conf_dir: Path = CONF_DIR) -> dict[str, list[str]]:
    """{config group: its options} from conf/<group>/<option>.yaml; conf: every preset name
    (asr.config.presets: the corpus setup files and the presets made from them)."""
    from asr.config.presets import preset_names
    options = {folder.name: sorted(path.stem for path in folder.glob("*.yaml"))
               for folder in sorted(conf_dir.iterdir()) if folder.is_dir() and not folder.name.startswith(".")}
    options["conf"] = preset_names()
    return options


def train_config_keys() -> list[str]:
    """Every leaf key of asr.train's schema (sections flattened: trainer.max_minutes, ...)."""
    from asr.config.schema import TrainConfig
    from asr.config.help import schema_keys

    return [key for key, *_ in schema_keys(TrainConfig)]


def misspelt_train_override(arguments: Sequence[str], conf_dir: Path = CONF_DIR) -> str | None:
    """For asr.train's command line: the message for the first override whose group option or key
    is a near miss of an existing one ("... did you mean conf=wsj_iclustered?"), or None."""
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.errors import HydraException

    groups = group_options(conf_dir)
    leaves = set(train_config_keys())
    sections = {key.rsplit(".", 1)[0] for key in leaves if "." in key}
    known = leaves | sections | set(groups)
    parser = OverridesParser.create()
    for argument in arguments:
        if argument.startswith("-") or "=" not in argument:   # Hydra's flags (--help, -m, --cfg job)
            continue
        try:
            override = parser.parse_override(argument)
        except HydraException:   # Hydra says what is wrong with its syntax
            continue
        key, value = override.key_or_group, override.value()
        if override.is_delete() or key == "hydra" or key.startswith(("hydra.", "hydra/")):   # Hydra's own
            continue
        if key in groups:
            if not isinstance(value, str) or value in groups[key]:
                continue
            match = closest_name(value, groups[key])
            what = "names no preset in conf/conf/" if key == "conf" else f"names no file in conf/{key}/"
            if match:
                return f"{key}={value} {what}; did you mean {key}={match}?"
            continue
        # below a leaf the schema leaves open (attention, model.loss_weights) any key may be given
        enclosing = [key.rsplit(".", depth)[0] for depth in range(1, key.count(".") + 1)]
        if key in known or any(prefix in leaves for prefix in enclosing):
            continue
        match = closest_name(key, known)
        if match in groups and isinstance(value, str):   # atention=full: the group attention
            return f"{key} is not a config key; did you mean {match}={value}?"
        if match:
            return f"{key} is not a config key; did you mean {match}?"
    return None


def exit_on_misspelt_override(command: str, arguments: Sequence[str]) -> None:
    """Before Hydra composes asr.train's config: a near miss of a preset, group option or key ends
    the command with one line naming what was meant, exit status 2 (asr.core.exit_status.USAGE_ERROR)."""
    from asr.core.exit_status import USAGE_ERROR

    mistake = misspelt_train_override(arguments)
    if mistake:
        print(f"{command}: error: {mistake}", file=sys.stderr)
        raise SystemExit(USAGE_ERROR)


def unknown_argument(error: Exception, arguments: Sequence[str]) -> str | None:
    """For the key=value commands (OmegaConf dotlists onto a dataclass): when OmegaConf refused an
    unknown key that is a near miss of one of `arguments`, "KEY is not an argument; did you mean
    NAME?"; otherwise None (the command keeps its own message)."""
    key = getattr(error, "full_key", None) or getattr(error, "key", None)
    if not isinstance(key, str) or key in arguments:
        return None
    match = closest_name(key, arguments)
    return f"{key} is not an argument; did you mean {match}?" if match else None

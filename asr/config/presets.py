"""The presets `conf=<corpus>_<attention>`: a corpus's setup with one attention.

    python -m asr.train conf=wsj_iclustered   ==   python -m asr.train conf=wsj attention=iclustered

Each corpus's setup is a file, conf/conf/<corpus>.yaml (which model, optimiser and trainer; a
preset itself, with full attention); each attention is a file, conf/attention/<name>.yaml. The
presets that pair them are not files: `register_presets` stores one in Hydra's ConfigStore for
every corpus setup and every attention of `preset_attentions()`, as

    defaults: [/conf/<corpus>, override /attention: <option>]   (+ model.shared_qk: true where needed)

so a new corpus gets its presets from its setup file, and a new attention from its registration
and its group file. What a preset would otherwise repeat comes from where it is known: a shared
query/key projection from the attention registry (`needs_shared_qk`), the attention's options
from its group file. Files in conf/conf/ whose name is no corpus's (librispeech_mini_iclustered)
are presets of their own, composed as they are.

`python -m asr.train --help` lists every preset under "conf"; tests/asr/test_presets.py holds
each to the config it composed to when the presets were 41 hand-written files.
"""
from __future__ import annotations

from pathlib import Path

import yaml
from hydra.core.config_store import ConfigStore

from attention_ext import available_attentions

CONF_DIR = Path(__file__).resolve().parents[2] / "conf"

# The paper's attentions, by preset suffix -> conf/attention/ option (Table 1's training rows).
PAPER_ATTENTIONS = {"full": "full", "shared_full": "shared_full", "lsh1": "lsh", "lsh4": "lsh4",
                    "clustered": "clustered", "iclustered": "iclustered"}
# The built-in corpus's utterances give ~400 encoder positions, too few for the paper's 100
# clusters: its clustered presets take 64 (at most a quarter of the positions).
SHORT_UTTERANCE_OPTIONS = {"synth": {"clustered": "clustered64", "iclustered": "iclustered64"}}


def preset_attentions() -> dict[str, str]:
    """Preset suffix -> attention group option: the paper's attentions, then every attention
    registered with `compare_as` that has its conf/attention/<name>.yaml (linear, agglomerative),
    in registry order, as every comparison of the project lists them (attention_ext.comparisons)."""
    further = {name: name for name, entry in available_attentions().items()
               if entry.compare_as is not None and (CONF_DIR / "attention" / f"{name}.yaml").is_file()}
    return {**PAPER_ATTENTIONS, **further}


def corpus_setups() -> list[str]:
    """The corpora with a setup file: conf/conf/<corpus>.yaml beside a conf/data/<corpus>.yaml."""
    return sorted(path.stem for path in (CONF_DIR / "conf").glob("*.yaml")
                  if (CONF_DIR / "data" / path.name).is_file())


def attention_name(option: str) -> str:
    return yaml.safe_load((CONF_DIR / "attention" / f"{option}.yaml").read_text())["name"]


def preset_node(corpus: str, option: str) -> dict:
    node: dict = {"defaults": [f"/conf/{corpus}", {"override /attention": option}]}
    if available_attentions()[attention_name(option)].needs_shared_qk:
        node["model"] = {"shared_qk": True}
    return node


def generated_presets() -> dict[str, dict]:
    """Preset name -> its ConfigStore node, for every corpus setup and preset attention."""
    return {f"{corpus}_{suffix}": preset_node(corpus, SHORT_UTTERANCE_OPTIONS.get(corpus, {}).get(suffix, option))
            for corpus in corpus_setups() for suffix, option in preset_attentions().items()}


def preset_names() -> list[str]:
    """Every name `conf=` takes: the files of conf/conf/ and the generated presets."""
    return sorted({path.stem for path in (CONF_DIR / "conf").glob("*.yaml")} | set(generated_presets()))


def register_presets() -> None:
    for name, node in generated_presets().items():
        ConfigStore.instance().store(group="conf", name=name, node=node, package="_global_")

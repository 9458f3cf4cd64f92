"""Tiny training runs for the asr tests: a model and a run small enough for seconds on a CPU."""
from __future__ import annotations

from pathlib import Path

from hydra import compose, initialize_config_dir

from asr.config import register_schema

ROOT = Path(__file__).resolve().parents[2]
CONF = ROOT / "conf"
# Every preset keeps its attention; only the sizes shrink. Epochs are the budget: the synth presets'
# step budget is off (resuming a max_steps run from an epoch's end runs Lightning's epoch counter one
# ahead, so a max_epochs budget would end the resumed run early).
TINY = ["model.layers=1", "model.heads=2", "model.head_dim=8", "model.ff_dim=32", "model.subsampling_channels=4",
        "data.max_duration=25", "data.progress=false", "data.feature_jobs=1", "data.num_buckets=2",
        "trainer.max_epochs=1", "trainer.max_minutes=null", "trainer.max_steps=-1",
        "trainer.enable_progress_bar=false",
        "trainer.log_every_n_steps=1", "trainer.early_stopping_patience=null",
        # no real-speech test at the end (preparing asterisk takes minutes; test_real_speech_line.py checks it)
        "data.real_speech_test=null",
        # no waveform augmentation unless a test asks for it (test_faults.py trains with all of it): the
        # synth presets' channel and level effects would compute half the features on the fly
        "data.augment.channel_prob=0.0", "data.augment.volume_prob=0.0"]


def compose_config(*overrides: str):
    register_schema()   # the schema and the presets, as `python -m asr.train` registers them
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        return compose(config_name="config", overrides=list(overrides))


def tiny_config(corpus: Path, *overrides: str):
    return compose_config(*TINY, f"data.root={corpus}", *overrides)

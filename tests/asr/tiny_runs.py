"""Tiny training runs for the asr tests: a model and a run small enough for seconds on a CPU."""
from __future__ import annotations

import gzip
import json
import os
from pathlib import Path

from hydra import compose, initialize_config_dir

from asr.config.schema import register_schema

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


def subprocess_environment() -> dict[str, str]:
    """The environment of a `python -m asr.train` subprocess: this checkout importable, and none of
    the variables by which a launcher (torchrun, srun, Lightning) tells a process its rank."""
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    for name in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "NODE_RANK", "GROUP_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR",
                 "MASTER_PORT", "TORCHELASTIC_RUN_ID", "SLURM_JOB_ID", "SLURM_PROCID", "SLURM_STEP_NUM_TASKS",
                 "SLURM_NTASKS", "ASR_PAUSE_AT"):
        env.pop(name, None)
    return env


def validate_in_one_process(run: Path, checkpoint: Path):
    """A single-process validation of `checkpoint` on its run's dev split (the run's config.yaml):
    (the error rates, the validation loss) - what a multi-process run's gathered validation must equal."""
    import lightning as L
    from omegaconf import OmegaConf

    from asr.data.config import DataConfig
    from asr.data.datamodule import SpeechDataModule
    from asr.model.recognizer import SpeechRecognizer

    model = SpeechRecognizer.load_from_checkpoint(checkpoint, map_location="cpu")
    cfg = OmegaConf.load(run / "config.yaml")
    data = SpeechDataModule(DataConfig.of(cfg.data), frame_subsampling=cfg.model.subsampling, seed=cfg.seed)
    data.set_tokenizers(model.hparams.tokenizers)
    single = L.Trainer(accelerator="cpu", devices=1, logger=False, enable_checkpointing=False,
                       enable_progress_bar=False, enable_model_summary=False, use_distributed_sampler=False)
    single.validate(model, datamodule=data, verbose=False)
    return model.last_error_rates["val"], single.callback_metrics["val/loss"].item()


def synth_corpus_contents(root: Path) -> dict[str, bytes]:
    """A generated synth corpus folder as {relative path: bytes}, gzip files decompressed, the feature
    cache left out, and its report without the seconds the generation took (checked to be there), so
    two generations of one plan compare equal file by file."""
    files = {}
    for path in sorted(root.rglob("*")):
        if path.is_file() and "features" not in path.parts:
            name = str(path.relative_to(root))
            files[name] = gzip.decompress(path.read_bytes()) if name.endswith(".gz") else path.read_bytes()
    report = json.loads(files.pop("synth_report.json"))
    assert report.pop("generation") is not None   # seconds
    return dict(files, report=json.dumps(report, sort_keys=True).encode())

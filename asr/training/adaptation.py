"""A run that starts from a trained model: `asr.train init_from=CHECKPOINT_OR_RUN_FOLDER`, e.g. adapting
it to ten minutes of your own voice (asr/docs/training.md, "Adapting a model to your voice"):

    python -m asr.train conf=adapt init_from=runs/synth_iclustered/<time> adapt.data_dir=my_voice/

What the run takes from the trained model (`adaptation_source`, before the config is checked): its
weights and feature statistics (`AdaptationSource.initialise`), its tokenizers and feature front-end
(the data module gets them), its model and attention settings and its heads as data.targets (written
into the config, so config.yaml records the model the run trains). A value of those given on the
command line that differs from the model's is a ConfigError naming it. What the run does not take:
the optimiser state, the step count, the learning-rate schedule and the run folder - it is a new run,
with its own folder, from step 0. Its run folder gets the trained model's lexicon and LM (decoding/),
so asr.evaluate, asr.transcribe and decoder=lexicon use it as any other.

With adapt.data_dir, the Kaldi-style folder is the training data (asr.training.adaptation_data: corpus
`adapt` in adapt.prepared_dir, splits train and dev). `adapt.freeze` keeps parts of the model at the
trained values (`freeze`). `ckpt_path=last` with the same init_from resumes an adaptation run like any
run; init_from with a ckpt_path file is refused (one is a new run, the other a resumed one).
"""
from __future__ import annotations

import logging
from dataclasses import asdict, dataclass
from pathlib import Path

import yaml
from omegaconf import DictConfig

from asr.core.errors import ConfigError
from asr.data.corpus.manifests import cuts_path
from asr.training.adaptation_data import (ADAPTATION_CORPUS, DEV, REHEARSAL_SPLIT, TEST, TRAIN,
                                          AdaptationDataError, AdaptationFolders, prepare_adaptation_data,
                                          rehearsal_line, summary_line, write_rehearsal_split)
from asr.model.checkpoint import CheckpointError, feature_frontend, read_checkpoint
from asr.model.decoding_files import model_decoding_files
from asr.model.recognizer import ENCODER_ARGUMENTS, SpeechRecognizer, check_state_dict_fits, encoder_arguments
from asr.model.run_folder import one_process_at_a_time, run_folder_of, stored_data_config

log = logging.getLogger("asr.train")

FREEZE_CHOICES = ("none", "frontend", "encoder_lower_half", "encoder")
# The model's shape, which the run takes from init_from (model.dropout and model.loss_weights are the run's own)
MODEL_SHAPE = tuple(key for key in ENCODER_ARGUMENTS if key != "dropout")
FOLLOWS_THE_MODEL = (", and follows the model an adaptation run starts from; leave it out (config.yaml of the "
                     "run records the model's value)")


@dataclass
class AdaptationSource:
    """The trained model a run starts from (init_from)."""
    path: Path
    checkpoint: dict

    @property
    def hyper_parameters(self) -> dict:
        return self.checkpoint["hyper_parameters"]

    @property
    def tokenizers(self) -> dict:
        return self.hyper_parameters["tokenizers"]

    @property
    def frontend(self):
        return feature_frontend(self.hyper_parameters)

    @property
    def decoding_folder(self) -> Path | None:
        """The folder holding the trained model's lexicon.txt (and lm/), for the new run's decoding/."""
        files = model_decoding_files(self.path)
        return files.lexicon.parent if files.lexicon is not None else None

    def initialise(self, model: SpeechRecognizer) -> None:
        """The trained weights and feature statistics into the new run's model."""
        check_state_dict_fits(model, self.checkpoint["state_dict"], f"init_from={self.path}")
        model.load_state_dict(self.checkpoint["state_dict"])
        log.info("starting from %s (step %s of its run)", self.path, self.checkpoint.get("global_step"))


def checkpoint_of(init_from: str) -> Path:
    """The .ckpt that init_from names: the file, or a run folder's (or checkpoints folder's) best.ckpt."""
    path = Path(init_from).expanduser()
    if not path.exists():
        raise ConfigError(f"init_from={init_from!r}: no such checkpoint file or run folder; give a .ckpt written "
                          "by asr.train or its run folder (runs/<preset>/<time>)")
    if path.is_file():
        return path
    for candidate in (path / "checkpoints" / "best.ckpt", path / "best.ckpt"):
        if candidate.is_file():
            return candidate
    raise ConfigError(f"init_from={init_from!r} is a folder without checkpoints/best.ckpt; give an asr.train run "
                      "folder or one of its .ckpt files")


def adaptation_source(cfg: DictConfig, overrides: list[str]) -> AdaptationSource | None:
    """The trained model the run starts from, None without init_from. The config then follows that
    model (module doc); `overrides` are the command line's (Hydra's task overrides), checked against it."""
    # data.corpus=adapt (the adapt preset's) is the corpus adapt.data_dir is prepared into: it needs both
    if cfg.data.corpus == ADAPTATION_CORPUS and (cfg.init_from in (None, "") or cfg.adapt.data_dir is None):
        raise ConfigError(f"data.corpus={ADAPTATION_CORPUS} (conf=adapt) adapts a trained model to your recordings: "
                          "give init_from=CHECKPOINT_OR_RUN_FOLDER and "
                          "adapt.data_dir=KALDI_FOLDER (wav.scp and text of your recordings), e.g. python -m "
                          "asr.train conf=adapt init_from=runs/synth_iclustered/<time> adapt.data_dir=my_voice")
    if cfg.init_from in (None, ""):
        from asr.config.schema import AdaptConfig
        given = [key for key, default in asdict(AdaptConfig()).items() if cfg.adapt[key] != default]
        if given:
            raise ConfigError(f"adapt.{given[0]}={cfg.adapt[given[0]]!r} applies to a run that starts from a trained "
                              "model: give init_from=CHECKPOINT_OR_RUN_FOLDER")
        return None
    if cfg.ckpt_path not in (None, "", "last"):
        raise ConfigError(f"init_from={cfg.init_from!r} with ckpt_path={cfg.ckpt_path!r}: init_from starts a new run "
                          "from a trained model, ckpt_path=FILE resumes a run from its checkpoint; give one of them "
                          "(ckpt_path=last with init_from resumes the adaptation run itself)")
    path = checkpoint_of(cfg.init_from)
    try:
        source = AdaptationSource(path.resolve(), read_checkpoint(path))
    except CheckpointError as error:
        raise ConfigError(f"init_from: {error}") from None
    check_adapt_section(cfg)
    check_overrides_follow_model(cfg, overrides, source)
    follow_model(cfg, source)
    return source


def check_adapt_section(cfg: DictConfig) -> None:
    adapt = cfg.adapt
    if adapt.freeze not in FREEZE_CHOICES:
        raise ConfigError(f"adapt.freeze={adapt.freeze!r} is not allowed: choose one of {', '.join(FREEZE_CHOICES)}")
    if not 0.0 < adapt.dev_fraction < 1.0:
        raise ConfigError(f"adapt.dev_fraction={adapt.dev_fraction!r} is not allowed: a share in (0, 1), e.g. 0.1")
    if not (isinstance(adapt.rehearsal, (int, float)) and 0.0 <= adapt.rehearsal <= 100.0):
        raise ConfigError(f"adapt.rehearsal={adapt.rehearsal!r} is not allowed: seconds of the trained model's "
                          "training data per second of yours, from 0 (none) to 100, e.g. 1")
    if adapt.rehearsal_cuts is not None and not adapt.rehearsal:
        raise ConfigError(f"adapt.rehearsal_cuts={adapt.rehearsal_cuts!r} needs adapt.rehearsal > 0 (how much of it "
                          "to mix in), e.g. adapt.rehearsal=1")
    if adapt.data_dir is None:
        others = [key for key in ("dev_data_dir", "test_data_dir", "prepared_dir") if adapt[key] is not None]
        others += ["rehearsal"] if adapt.rehearsal else []
        if others:
            raise ConfigError(f"adapt.{others[0]}={adapt[others[0]]!r} needs adapt.data_dir (the folder to train on)")
        return
    if cfg.test and adapt.test_data_dir is None:
        raise ConfigError("test=true with adapt.data_dir: there is no test split to score; give test=false (score "
                          "the adapted model later with asr.evaluate data_dir=FOLDER) or adapt.test_data_dir=FOLDER")


def check_overrides_follow_model(cfg: DictConfig, overrides: list[str], source: AdaptationSource) -> None:
    """ConfigError for a command-line value of what the model fixes that differs from the model's."""
    from asr.config.schema import attention_settings
    hyper = source.hyper_parameters
    for override in overrides:
        key = override.split("=", 1)[0].lstrip("+~")
        if key == "attention" or key.startswith("attention."):
            # both with the registry's defaults filled in: a checkpoint from before an option existed
            # holds the attention that option's default gives
            if attention_settings(cfg.attention).as_config() != attention_settings(hyper["attention"]).as_config():
                raise ConfigError(f"{key}: the attention is the model's ({hyper['attention']}){FOLLOWS_THE_MODEL}; "
                                  "evaluate it with another attention with asr.evaluate attention=...")
        elif key.startswith("model.") and key[6:] in MODEL_SHAPE:
            shape = encoder_arguments(hyper["model"])   # with the values of keys the checkpoint predates
            if cfg.model[key[6:]] != shape[key[6:]]:
                raise ConfigError(f"{key}={cfg.model[key[6:]]!r} does not fit init_from={str(source.path)!r}: its "
                                  f"model has {key}={shape[key[6:]]!r}{FOLLOWS_THE_MODEL}")
        elif key == "data.targets" and list(cfg.data.targets) != list(source.tokenizers):
            raise ConfigError(f"data.targets={list(cfg.data.targets)} does not fit init_from={str(source.path)!r}: "
                              f"its heads are {list(source.tokenizers)}{FOLLOWS_THE_MODEL}")
        elif key == "data.num_mel_bins" and cfg.data.num_mel_bins != source.frontend.num_mel_bins:
            raise ConfigError(f"data.num_mel_bins={cfg.data.num_mel_bins} does not fit init_from="
                              f"{str(source.path)!r}: its front-end computes {source.frontend.num_mel_bins}"
                              f"{FOLLOWS_THE_MODEL}")


def follow_model(cfg: DictConfig, source: AdaptationSource) -> None:
    """Writes the model's settings into the config, and with adapt.data_dir the adaptation corpus."""
    hyper = source.hyper_parameters
    shape = encoder_arguments(hyper["model"])
    for key in MODEL_SHAPE:
        cfg.model[key] = shape[key]
    if not cfg.model.loss_weights:   # the run's own weights where given, else the trained model's
        cfg.model.loss_weights = dict(hyper["model"].get("loss_weights") or {})
    cfg.attention = dict(hyper["attention"])
    cfg.data.targets = list(source.tokenizers)
    cfg.data.num_mel_bins = source.frontend.num_mel_bins
    cfg.init_from = str(source.path)   # config.yaml records the file itself
    adapt = cfg.adapt
    if adapt.data_dir is None:
        return
    prepared = adapt.prepared_dir or str(Path(adapt.data_dir).expanduser() / "asr_adapt")
    cfg.data.corpus, cfg.data.root = ADAPTATION_CORPUS, str(Path(prepared).expanduser().resolve())
    cfg.data.train_split, cfg.data.dev_split = TRAIN, DEV
    cfg.data.test_split = TEST if adapt.test_data_dir else DEV   # asr.evaluate's default split: the held-out part
    cfg.data.real_speech_test = None
    if adapt.rehearsal:
        cfg.data.train_split = REHEARSAL_SPLIT
        adapt.rehearsal_cuts = str(rehearsal_manifest(adapt.rehearsal_cuts, source.path))


def rehearsal_manifest(given: str | None, checkpoint: Path) -> Path:
    """The cuts manifest adapt.rehearsal mixes in: `given`, or the training split the config.yaml of the
    checkpoint's run folder names (its data.root relative to the current folder, as asr.train reads it)."""
    if given is not None:
        path = Path(given).expanduser()
        if not path.is_file():
            raise ConfigError(f"adapt.rehearsal_cuts={given!r}: no such file; give a cuts manifest "
                              "(<corpus>_cuts_<split>.jsonl.gz) of the data the model was trained on")
        return path.resolve()
    run = run_folder_of(checkpoint)
    data = {} if run is None else stored_data_config(run)
    path = cuts_path(data["root"], data["corpus"], data.get("train_split", TRAIN)) \
        if data.get("root") and data.get("corpus") else None
    if path is None or not path.is_file():
        found = (f"{run / 'config.yaml'} names its training split {path}, which is not there" if path is not None
                 else f"the config.yaml of {checkpoint}'s run folder is not there to name its training data")
        raise ConfigError(f"adapt.rehearsal mixes in the trained model's training data, but {found}; give "
                          "adapt.rehearsal_cuts=<the cuts manifest it was trained on> (from the folder asr.train ran in, "
                          "a relative data.root is relative to it)")
    return path.resolve()


def prepare_data(cfg: DictConfig, run_dir: Path) -> None:
    """The Kaldi-style folders of adapt.* -> manifests in data.root (once; asr.training.adaptation_data),
    by one process of a multi-process run at a time (the others find them done)."""
    adapt = cfg.adapt
    if adapt.data_dir is None:
        return
    folders = AdaptationFolders(adapt.data_dir, adapt.dev_data_dir, adapt.test_data_dir)
    try:
        with one_process_at_a_time(run_dir / ".data_preparation.lock"):
            report = prepare_adaptation_data(folders, cfg.data.root, dev_fraction=adapt.dev_fraction,
                                             seed=adapt.dev_seed, phones="phones" in cfg.data.targets,
                                             skip_bad_audio=cfg.data.skip_bad_audio, progress=bool(cfg.data.progress),
                                             allow_commands=cfg.data.allow_commands)
            if adapt.rehearsal:   # written at every start: one pass over the manifest, the same for the same settings
                taken = write_rehearsal_split(cfg.data.root, adapt.rehearsal_cuts, adapt.rehearsal,
                                              seed=adapt.dev_seed, phones="phones" in cfg.data.targets)
    except AdaptationDataError as error:
        raise ConfigError(str(error)) from None
    log.info("%s", summary_line(report))
    if adapt.rehearsal:
        log.info("%s", rehearsal_line(taken))


def check_resume(cfg: DictConfig, run_dir: Path, resume_from: Path | None) -> None:
    """A resumed run keeps where it started from: the same init_from as its config.yaml records, or none."""
    stored_file = run_dir / "config.yaml"
    if resume_from is None or not stored_file.is_file():
        return
    stored = (yaml.safe_load(stored_file.read_text()) or {}).get("init_from")
    if stored == (cfg.init_from or None):
        return
    if stored is None:
        raise ConfigError(f"run folder {run_dir} was not started from a trained model; resume it without init_from")
    raise ConfigError(f"run folder {run_dir} adapts {stored}: resume it with its own command (init_from={stored} "
                      "and the same adapt.* options) and ckpt_path=last" + (f", not init_from={cfg.init_from}"
                                                                            if cfg.init_from else ""))


def frozen_modules(model: SpeechRecognizer, freeze: str) -> list:
    encoder = model.encoder
    # the input norm (model.input_norm) belongs to the front end: it shapes what the first layer reads
    front_end = [encoder.frontend] + ([encoder.input_norm] if encoder.input_norm is not None else [])
    return {"none": [], "frontend": front_end,
            "encoder_lower_half": [*front_end, *encoder.layers[:len(encoder.layers) // 2]],
            "encoder": [encoder]}[freeze]


def start_model(model: SpeechRecognizer, source: AdaptationSource, freeze: str, resuming: bool) -> None:
    """The new run's model: the trained weights (unless a resumed run's checkpoint gives them), frozen
    where adapt.freeze says."""
    if not resuming:
        source.initialise(model)
    freeze_parameters(model, freeze)


def freeze_parameters(model: SpeechRecognizer, freeze: str) -> None:
    """Parameters of the frozen part get no gradient, so the optimiser leaves them exactly as they were."""
    for module in frozen_modules(model, freeze):
        for parameter in module.parameters():
            parameter.requires_grad_(False)
    trained = sum(p.numel() for p in model.parameters() if p.requires_grad)
    log.info("adapt.freeze=%s: %s of %s parameters are trained", freeze, f"{trained:,}",
             f"{sum(p.numel() for p in model.parameters()):,}")


def command_line_overrides() -> list[str]:
    """Hydra's task overrides of this run (none when train() is called without Hydra, e.g. by tests)."""
    from hydra.core.hydra_config import HydraConfig
    return list(HydraConfig.get().overrides.task) if HydraConfig.initialized() else []

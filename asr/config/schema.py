"""The typed schema of `python -m asr.train`'s Hydra config, and its start-up checks.

The dataclasses below are registered in Hydra's ConfigStore as `train_schema`; conf/config.yaml
lists it first in its defaults, so every group file, preset and command-line override is merged
onto typed, closed (struct) nodes: an unknown key or a value of the wrong type fails while Hydra
composes the config, before anything runs. `validate_config` then checks what types cannot say
(ranges, attention names and options through attention_ext's registry, combinations) and raises
ConfigError with the offending key, its value and what is allowed.

`attention` is the one open node: its keys are `name` plus that attention's options, checked by
attention_ext.validate_attention (the group files in conf/attention/ list every option, so
`attention.clusters=200` is an ordinary override). That is its one check: `validate_config`
returns the ValidatedAttention, which the model builds as it is, and the data section as a
DataConfig (asr.data.config), from which the data module and the corpus are made without another check.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Dict, NamedTuple, Optional

from hydra.core.config_store import ConfigStore
from omegaconf import DictConfig, ListConfig, OmegaConf

from asr.core.errors import ConfigError
from asr.data.config import DataConfig
from asr.data.augment.waveform_augmentation import check_augment_sources
from asr.config.presets import register_presets
from attention_ext import AttentionConfigError, ValidatedAttention, validate_attention


@dataclass
class ModelConfig:
    """The encoder (asr/model/encoder.py) and its CTC heads. Defaults: the paper's WSJ model."""
    layers: int = 9                    # encoder layers
    heads: int = 6                     # attention heads per layer
    head_dim: int = 32                 # model width = heads * head_dim (192 in the paper)
    ff_dim: int = 768                  # width of each layer's feed-forward block
    dropout: float = 0.1               # dropout in attention and feed-forward blocks
    subsampling: int = 1               # 1, 2 or 4 (convolutional, stride 2 per factor of 2)
    subsampling_channels: int = 32     # channels of the subsampling convolutions
    shared_qk: bool = False            # one query/key projection; needed by shared_full and lsh
    positions: str = "sinusoidal"      # sinusoidal | sinusoidal_offset (random offset in training) | rotary | none
    # Layer form: pre (x + Attn(LN(x)), then x + FF(LN(x))) | post (LN(x + Attn(x)), then LN(x + FF(x)):
    # the reference library's layer, idiap/fast-transformers); checkpoints without the key are pre
    norm: str = "pre"
    # A LayerNorm over the scaled input and its positions before the first layer (asr/model/encoder.py
    # says why a post-norm encoder wants it); checkpoints without the key have none
    input_norm: bool = False
    # CTC loss weight per target kind (data.targets); a kind not named weighs 1.0.
    loss_weights: Dict[str, float] = field(default_factory=dict)


@dataclass
class OptimConfig:
    """RAdam + gradient clipping + lr reduced on a validation-loss plateau (paper, sup. C.3.1)."""
    lr: float = 1e-4                   # RAdam learning rate
    weight_decay: float = 0.01         # decoupled, as in the RAdam code the paper used
    clip_norm: float = 10.0            # max global gradient norm; 0 disables clipping
    plateau_factor: float = 0.5        # lr *= factor when val/loss has not improved ...
    plateau_patience: int = 1          # ... for more than this many validations in a row
    # The validation loss the plateau schedule watches: null, the sum of every head's weighted CTC loss
    # (val/loss); a target kind (data.targets), that head's loss alone (val/loss_<kind>). With two heads
    # the sum can keep falling on the secondary head's account while the primary one has stalled, and
    # the lr is then never lowered (recipes/synth/README.md, "Where the runs stand").
    plateau_target: Optional[str] = None
    min_lr: float = 1e-6               # the plateau schedule never goes below this
    warmup_steps: int = 0              # linear warm-up, on top of the plateau schedule


@dataclass
class TrainerConfig:
    """Passed to lightning.Trainer (and the callbacks train.py adds)."""
    max_epochs: int = 100              # -1: no epoch limit
    max_steps: int = -1                # -1: no step limit; else >= 1
    max_minutes: Optional[float] = None  # wall-clock budget for training; None: none
    accelerator: str = "auto"          # cpu | gpu | auto (a GPU when there is one)
    devices: Any = "auto"              # per node: a count >= 1, a list of GPU ids, or "auto" (all)
    num_nodes: int = 1                 # machines; the run has num_nodes x devices processes (DDP)
    strategy: str = "auto"             # "auto" is DDP when there are several devices or nodes
    # DDP: how long a process waits at a collective (gradient averaging, gathering the validation
    # transcripts, start-up) for the others before it gives up and the run stops. A killed process is
    # noticed at once; this bounds the wait for a hung one or a lost machine. Lightning's default.
    ddp_timeout_minutes: float = 30.0
    precision: str = "32-true"         # 32-true | bf16-mixed | 16-mixed (16-mixed needs a GPU)
    log_every_n_steps: int = 10        # training metrics to the logs every N steps
    val_check_interval: Optional[int] = None  # validate every N training batches; None: once per epoch
    # validate after every N-th epoch; null: val_check_interval counts training batches across epochs
    # (validation every N steps however long an epoch is; needs val_check_interval)
    check_val_every_n_epoch: Optional[int] = 1
    limit_train_batches: Optional[float] = None  # <= 1: fraction of the batches; > 1: a count
    limit_val_batches: Optional[float] = None  # as limit_train_batches, for validation
    limit_test_batches: Optional[float] = None  # as limit_train_batches, for the test split
    num_sanity_val_steps: int = 0      # validation batches run before training (a quick check of the loop)
    enable_progress_bar: bool = True   # progress bars of training, validation and test
    deterministic: bool = False        # torch's deterministic algorithms (CPU only: no deterministic CTC on a GPU)
    early_stopping_patience: Optional[int] = None  # validations without a better primary error
    # With early_stopping_patience: "better" is below the best so far x (1 - this), e.g. 0.02 for a 2 %
    # relative gain (asr.training.callbacks.RelativePlateauStop); null: any decrease (Lightning's EarlyStopping)
    early_stopping_min_relative_gain: Optional[float] = None
    # With the relative gain: no validation counts until the primary error first falls below this
    # (0.9: a model still at CTC's all-blank output, PER ~99 %, has not begun, and a flat PER there is
    # no plateau); null: from the first validation
    early_stopping_start_below: Optional[float] = None
    torch_threads: Optional[int] = None  # torch.set_num_threads (>= 1); None: torch's default
    # Debugging: every process writes the utterance ids of each batch it ran to
    # <run folder>/batches/rank<global rank>.jsonl (see asr.training.callbacks.BatchRecorder).
    record_batches: bool = False
    # Diagnosis: every N steps, per-layer gradient norms, query norms and attention entropy into
    # <run folder>/diagnostics.csv (asr.model.diagnostics); None: off.
    diagnostics_every_n_steps: Optional[int] = None
    # Keep every epoch's checkpoint too (checkpoints/epoch-NNN.ckpt), for asr.average.
    keep_epoch_checkpoints: bool = False
    # Keep the checkpoint of every N-th optimiser step too (checkpoints/step-NNNNNN.ckpt), e.g. for the
    # attention-sharpening curve (recipes/synth/sharpening.py); a resumed run keeps the schedule. None: off.
    keep_checkpoints_every_n_steps: Optional[int] = None
    # Rewrite checkpoints/last.ckpt every N optimiser steps too, not only at the end of an epoch: what a
    # long (streamed) epoch needs so that a killed run resumes mid-epoch (ckpt_path=last). None: off.
    checkpoint_every_n_steps: Optional[int] = None
    # torch.compile the encoder (fullgraph: any attention traces as one graph; the first batches of
    # each new shape compile, for a minute or more). Checkpoints are the same as without it.
    compile: bool = False
    # Replay the encoder's training forward+backward as CUDA graphs, one per batch shape (a GPU only;
    # needs data.fixed_batch_shapes=true; asr/model/graphed_encoder.py). Checkpoints are the same.
    cuda_graphs: bool = False


@dataclass
class SynthCorpusConfig:
    """How big a corpus to generate when data.corpus=synth and its manifests are missing."""
    train_utterances: int = 3000       # utterances of the generated training split
    dev_utterances: int = 200          # utterances of the generated dev split
    test_utterances: int = 200         # utterances of the generated test split
    seed: int = 0                      # seed of the generated sentences and voices
    jobs: Optional[int] = None         # processes that synthesise audio; None: one per core
    utterance_scale: int = 1           # K times longer utterances (about K x 8 s); the paper-length experiment uses 2
    # More voices: "festival" gives festival's 3 US English voices a quarter of the seen speakers'
    # utterances (recipes/synth/README.md); "piper": piper's neural voice piper_share of them;
    # "festival,piper": both; None: espeak-ng and flite only. Use its own data.root.
    extra_voices: Optional[str] = None
    piper_share: Optional[float] = None  # with piper: its share of the seen speakers' utterances; None: 0.25


@dataclass
class AdaptConfig:
    """A run that starts from a trained model (init_from): its data and what it trains
    (asr/training/adaptation.py; asr/docs/training.md, "Adapting a model to your voice")."""
    # A Kaldi-style folder of your speech (wav.scp, text; utt2spk and segments optional): the training
    # data, prepared once into prepared_dir. None: the data.* corpus, as in any run.
    data_dir: Optional[str] = None
    dev_data_dir: Optional[str] = None   # a second folder to validate on; None: hold out dev_fraction of data_dir
    dev_fraction: float = 0.1            # share of data_dir's utterances held out (whole sentences) ...
    dev_seed: int = 0                    # ... drawn with this seed
    test_data_dir: Optional[str] = None  # a folder scored at the end when test=true; None: none (then test=false)
    prepared_dir: Optional[str] = None   # manifests, audio and features; None: <data_dir>/asr_adapt
    # Parameters that keep the trained model's values: none | frontend (the subsampling convolutions) |
    # encoder_lower_half (and the lower half of the layers) | encoder (all of it: only the CTC heads learn)
    freeze: str = "none"
    # Seconds of the trained model's own training data mixed into training per second of yours (0: none):
    # the adapted model then forgets less of the voices it was trained on (asr/training/adaptation_data.py)
    rehearsal: float = 0.0
    rehearsal_cuts: Optional[str] = None   # that data's cuts manifest; None: the training split init_from's run folder names


@dataclass
class TrainConfig:
    attention: Dict[str, Any] = field(default_factory=lambda: {"name": "full"})
    model: ModelConfig = field(default_factory=ModelConfig)
    data: DataConfig = field(default_factory=DataConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    trainer: TrainerConfig = field(default_factory=TrainerConfig)
    synth_corpus: SynthCorpusConfig = field(default_factory=SynthCorpusConfig)
    seed: int = 0                      # initialisation, shuffling, SpecAugment and the attention's draws; 0 to 2^32-1
    run_root: str = "runs"             # runs go to <run_root>/<preset>/<timestamp> ...
    run_dir: Optional[str] = None      # ... unless this names the folder
    ckpt_path: Optional[str] = None    # "last": resume the newest run of this preset; or a .ckpt path
    # Start from a trained model (its .ckpt, or its run folder for checkpoints/best.ckpt): its weights,
    # tokenizers, feature statistics, front-end, model and attention; a fresh optimiser at step 0
    init_from: Optional[str] = None
    adapt: AdaptConfig = field(default_factory=AdaptConfig)   # what a run with init_from trains on and freezes
    test: bool = True                  # evaluate the best checkpoint on the test split at the end


def register_schema() -> None:
    """The schema, and the presets made from corpus setups and attentions (asr/config/presets.py)."""
    ConfigStore.instance().store(name="train_schema", node=TrainConfig)
    register_presets()


def _require(ok: bool, key: str, value: Any, rule: str) -> None:
    if not ok:
        raise ConfigError(f"{key}={value!r} is not allowed: {rule}")


def attention_settings(attention: Any) -> ValidatedAttention:
    """An attention node, validated by attention_ext's registry (it unpacks as name, options)."""
    attention = dict(OmegaConf.to_container(attention, resolve=True) if isinstance(attention, DictConfig)
                     else attention)
    if "name" not in attention:
        raise ConfigError("attention has no name; choose one with attention=NAME (e.g. attention=full)")
    return validate_attention(**attention)


# Mixed precision runs the model under torch.autocast with float32 weights; the attentions with
# compiled kernels (clustered, iclustered, lsh) take the half-precision q, k, v as they are: on
# CUDA they compute in that dtype (accumulating in float32), on the CPU in float32 (see
# attention_ext.contract.kernel_dtype). The "-true" precisions
# (weights in half precision) are not offered: they are untested here and RAdam's state would be
# half precision too.
PRECISIONS = ("32-true", "bf16-mixed", "16-mixed")


def trains_on_cpu(trainer: Any) -> bool:
    """Whether Lightning will put this run on the CPU (accelerator cpu, or auto without CUDA)."""
    import torch

    accelerator = str(trainer.accelerator).lower()
    return accelerator == "cpu" or (accelerator == "auto" and not torch.cuda.is_available())


def gpu_visible() -> bool:
    import torch

    return torch.cuda.is_available()


def gpu_absence() -> str:
    """Why torch sees no GPU, and what to do (a CPU torch, or a container started without GPUs)."""
    import torch

    if torch.version.cuda is None:
        return f"torch {torch.__version__} is a CPU build"
    return (f"torch {torch.__version__} is built for CUDA {torch.version.cuda} but finds no device; in Docker "
            "start the container with --gpus all on a host with the NVIDIA driver and Container Toolkit")


class ValidatedConfig(NamedTuple):
    """What `validate_config` checked, in the form the run uses it: built from, never checked again."""
    attention: ValidatedAttention   # the model builds it as it is
    data: DataConfig                # the data module and the corpus are made from it


def validate_config(cfg: Any) -> ValidatedConfig:
    """Checks ranges and combinations; raises ConfigError / AttentionConfigError with the fix.

    Returns the validated attention and data section, for the run to build without checking them again.
    """
    try:
        attention = attention_settings(cfg.attention)
    except AttentionConfigError as error:
        raise AttentionConfigError(f"attention: {error}") from None
    _check_model_section(cfg.model, attention)
    data = _check_data_section(cfg)
    _check_optim_section(cfg.optim)
    _check_trainer_section(cfg.trainer)
    _check_cuda_graph_options(cfg)
    _check_seed("seed", cfg.seed)
    _check_synth_corpus_section(cfg.synth_corpus)
    _check_seed("adapt.dev_seed", cfg.adapt.dev_seed)
    return ValidatedConfig(attention, data)


# The largest seed: Lightning's seed_everything seeds NumPy too, whose seeds are unsigned 32-bit.
MAX_SEED = 2**32 - 1


def _check_seed(key: str, value: int) -> None:
    _require(0 <= value <= MAX_SEED, key, value, f"a seed is a whole number in [0, {MAX_SEED}]")


def _check_synth_corpus_section(synth: Any) -> None:
    """synth_corpus.*: the built-in corpus's sizes, seed and processes (used when it is generated)."""
    for key in ("train_utterances", "dev_utterances", "test_utterances", "utterance_scale"):
        _require(getattr(synth, key) >= 1, f"synth_corpus.{key}", getattr(synth, key), "must be >= 1")
    _check_seed("synth_corpus.seed", synth.seed)
    _require(synth.jobs is None or synth.jobs >= 1, "synth_corpus.jobs", synth.jobs,
             "must be a number of processes >= 1, or null (one per core)")


def _check_model_section(model: Any, attention: ValidatedAttention) -> None:
    """model.*: sizes, subsampling, dropout, and the attention against the heads."""
    from asr.model.encoder import NORMS, POSITION_SCHEMES, SUBSAMPLING_STRIDES, check_attention_fits
    for key in ("layers", "heads", "head_dim", "ff_dim", "subsampling_channels"):
        _require(getattr(model, key) >= 1, f"model.{key}", getattr(model, key), "must be >= 1")
    check_attention_fits(attention, model.shared_qk, model.head_dim)
    _require(model.subsampling in SUBSAMPLING_STRIDES, "model.subsampling", model.subsampling, "must be 1, 2 or 4")
    _require(0.0 <= model.dropout < 1.0, "model.dropout", model.dropout, "must lie in [0, 1)")
    _require(model.positions in POSITION_SCHEMES, "model.positions", model.positions,
             f"must be one of {', '.join(POSITION_SCHEMES)}")
    _require(model.norm in NORMS, "model.norm", model.norm, f"must be one of {', '.join(NORMS)}")
    _require(model.positions != "none" or model.subsampling > 1, "model.positions", model.positions,
             "needs model.subsampling 2 or 4: with subsampling 1 nothing tells the encoder the order of its frames")


def _check_data_section(cfg: Any) -> DataConfig:
    """data.* (the DataConfig it makes), and model.loss_weights and optim.plateau_target against data.targets."""
    try:
        data = DataConfig.of(cfg.data)   # data.targets among them
        check_augment_sources(data.augment)
    except ValueError as error:
        raise ConfigError(str(error)) from None
    targets = list(cfg.data.targets)
    for kind, weight in cfg.model.loss_weights.items():
        _require(kind in targets, f"model.loss_weights.{kind}", weight,
                 f"names no target; the targets (data.targets) are {targets}")
        _require(math.isfinite(weight) and weight >= 0.0, f"model.loss_weights.{kind}", weight,
                 "must be a finite number >= 0")
    plateau_target = cfg.optim.get("plateau_target")
    _require(plateau_target is None or plateau_target in targets, "optim.plateau_target", plateau_target,
             f"names no target; the targets (data.targets) are {targets} (null: the sum of their losses)")
    return data


def _check_optim_section(optim: Any) -> None:
    for key in ("lr", "weight_decay", "clip_norm", "min_lr"):   # NaN fails every comparison below; inf does not
        _require(math.isfinite(getattr(optim, key)), f"optim.{key}", getattr(optim, key), "must be a finite number")
    _require(optim.lr > 0, "optim.lr", optim.lr, "must be > 0")
    _require(optim.min_lr >= 0, "optim.min_lr", optim.min_lr, "must be >= 0")
    _require(optim.weight_decay >= 0, "optim.weight_decay", optim.weight_decay, "must be >= 0")
    _require(optim.clip_norm >= 0, "optim.clip_norm", optim.clip_norm, "must be >= 0 (0 disables clipping)")
    _require(0 < optim.plateau_factor < 1, "optim.plateau_factor", optim.plateau_factor, "must lie in (0, 1)")
    _require(optim.plateau_patience >= 0, "optim.plateau_patience", optim.plateau_patience, "must be >= 0")
    _require(optim.warmup_steps >= 0, "optim.warmup_steps", optim.warmup_steps, "must be >= 0")


def _check_trainer_section(trainer: Any) -> None:
    _require(trainer.max_epochs >= 1 or trainer.max_epochs == -1, "trainer.max_epochs", trainer.max_epochs,
             "must be >= 1 (or -1 for no limit)")
    _require(trainer.max_steps >= 1 or trainer.max_steps == -1, "trainer.max_steps", trainer.max_steps,
             "must be >= 1 (or -1 for no limit)")
    _check_devices(trainer.devices)
    _require(trainer.torch_threads is None or trainer.torch_threads >= 1, "trainer.torch_threads",
             trainer.torch_threads, "must be a number of threads >= 1, or null (torch's default)")
    _require(trainer.log_every_n_steps >= 1, "trainer.log_every_n_steps", trainer.log_every_n_steps, "must be >= 1")
    _require(trainer.num_sanity_val_steps >= -1, "trainer.num_sanity_val_steps", trainer.num_sanity_val_steps,
             "must be a number of batches >= 0 (or -1 for the whole dev split)")
    _require(trainer.early_stopping_patience is None or trainer.early_stopping_patience >= 0,
             "trainer.early_stopping_patience", trainer.early_stopping_patience,
             "must be a number of validations >= 1, or 0 or null (off)")
    _require(trainer.max_minutes is None or trainer.max_minutes > 0, "trainer.max_minutes",
             trainer.max_minutes, "must be > 0 or null")
    for key in ("limit_train_batches", "limit_val_batches", "limit_test_batches"):
        value = getattr(trainer, key)
        _require(value is None or (value > 0 and (value <= 1 or float(value).is_integer())),
                 f"trainer.{key}", value, "must be a fraction in (0, 1], a whole number of batches, or null")
    _require(trainer.precision in PRECISIONS, "trainer.precision", trainer.precision,
             f"choose one of {', '.join(PRECISIONS)}")
    # Lightning would quietly train in bfloat16 instead (fp16 autocast is a GPU feature)
    _require(not (trainer.precision == "16-mixed" and trains_on_cpu(trainer)), "trainer.precision",
             trainer.precision, f"float16 mixed precision needs a GPU, and this run trains on the CPU "
             f"(trainer.accelerator={trainer.accelerator}); use trainer.precision=bf16-mixed (bfloat16 "
             "autocast, which CPUs support) or 32-true")
    # torch.use_deterministic_algorithms refuses CTC's backward on CUDA: the first training step
    # would stop with a RuntimeError from inside the loss
    _require(not (trainer.deterministic and not trains_on_cpu(trainer)), "trainer.deterministic",
             trainer.deterministic, f"PyTorch has no deterministic CTC loss backward on a GPU, and this run "
             f"trains on one (trainer.accelerator={trainer.accelerator}); use trainer.deterministic=false "
             "(the run is still seeded, but not bit-for-bit repeatable on a GPU) or train on the CPU "
             "(trainer.accelerator=cpu)")
    # Lightning would stop later, after the data is loaded, with a traceback ("No supported gpu backend")
    _require(str(trainer.accelerator).lower() not in ("gpu", "cuda") or gpu_visible(), "trainer.accelerator",
             trainer.accelerator, f"no CUDA GPU is visible ({gpu_absence()}); use trainer.accelerator=auto or cpu")
    _require(trainer.diagnostics_every_n_steps is None or trainer.diagnostics_every_n_steps >= 1,
             "trainer.diagnostics_every_n_steps", trainer.diagnostics_every_n_steps, "must be >= 1 or null (off)")
    _require(trainer.checkpoint_every_n_steps is None or trainer.checkpoint_every_n_steps >= 1,
             "trainer.checkpoint_every_n_steps", trainer.checkpoint_every_n_steps, "must be >= 1 or null (off)")
    _require(trainer.keep_checkpoints_every_n_steps is None or trainer.keep_checkpoints_every_n_steps >= 1,
             "trainer.keep_checkpoints_every_n_steps", trainer.keep_checkpoints_every_n_steps,
             "must be a number of optimiser steps >= 1, or null (off)")
    _require(trainer.num_nodes >= 1, "trainer.num_nodes", trainer.num_nodes, "must be >= 1")
    _require(trainer.ddp_timeout_minutes > 0, "trainer.ddp_timeout_minutes", trainer.ddp_timeout_minutes,
             "must be a number of minutes > 0")
    _require(trainer.val_check_interval is None or trainer.val_check_interval >= 1, "trainer.val_check_interval",
             trainer.val_check_interval, "must be a number of training batches >= 1, or null (once per epoch)")
    _require(trainer.check_val_every_n_epoch is None or trainer.check_val_every_n_epoch >= 1,
             "trainer.check_val_every_n_epoch", trainer.check_val_every_n_epoch,
             "must be a number of epochs >= 1, or null (validation every trainer.val_check_interval steps)")
    # Lightning would stop inside fit with its own message about a float interval
    _require(trainer.check_val_every_n_epoch is not None or trainer.val_check_interval is not None,
             "trainer.check_val_every_n_epoch", trainer.check_val_every_n_epoch,
             "null needs trainer.val_check_interval=N (validate every N training batches)")
    gain = trainer.early_stopping_min_relative_gain
    _require(gain is None or 0 <= gain < 1, "trainer.early_stopping_min_relative_gain", gain,
             "must lie in [0, 1) (0.02: a 2 % relative gain), or null")
    _require(gain is None or trainer.early_stopping_patience, "trainer.early_stopping_min_relative_gain", gain,
             "needs trainer.early_stopping_patience=N (the validations it waits for that gain)")
    start = trainer.early_stopping_start_below
    _require(start is None or 0 < start <= 1, "trainer.early_stopping_start_below", start,
             "must lie in (0, 1] (0.9: the rule begins once the primary error is below 90 %), or null")
    _require(start is None or gain is not None, "trainer.early_stopping_start_below", start,
             "needs trainer.early_stopping_min_relative_gain=G (the relative plateau rule it delays)")


def _check_devices(devices: Any) -> None:
    """trainer.devices: "auto", a count >= 1, a list of GPU ids (>= 0, each once), or Lightning's
    string forms of them ("2", "0,1")."""
    rule = 'must be "auto", a number of devices >= 1, or a list of GPU ids such as [0,1]'
    value = OmegaConf.to_container(devices) if isinstance(devices, ListConfig) else devices
    if isinstance(value, str) and value != "auto":
        parts = [part.strip() for part in value.split(",")]
        ids = [int(part) for part in parts if part.isdigit()]
        _require(len(ids) == len([p for p in parts if p]) and ids, "trainer.devices", devices, rule)
        value = ids if "," in devices else ids[0]
    if isinstance(value, bool):
        _require(False, "trainer.devices", devices, rule)
    elif isinstance(value, int):
        _require(value >= 1, "trainer.devices", devices, rule)
    elif isinstance(value, list):
        _require(bool(value) and all(isinstance(i, int) and not isinstance(i, bool) and i >= 0 for i in value)
                 and len(set(value)) == len(value), "trainer.devices", devices, rule)
    elif value != "auto":
        _require(False, "trainer.devices", devices, rule)


def _check_cuda_graph_options(cfg: Any) -> None:
    """trainer.cuda_graphs and what it needs (asr.model.graphed_encoder says what and why)."""
    from asr.model.graphed_encoder import check_cuda_graph_options
    try:
        check_cuda_graph_options(cfg.trainer, cfg.data, trains_on_cpu(cfg.trainer))
    except ValueError as error:
        raise ConfigError(str(error)) from None

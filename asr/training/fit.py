"""One training run: `train(cfg, run_dir)` checks the config, makes the built-in corpus if it is
missing, builds the data module, the model and the Lightning Trainer, fits, tests the best
checkpoint and writes results.json. `python -m asr.train` (asr/train.py) is the command around it:
Hydra, the run folder's log and the exit statuses.

The flow, top to bottom: check the config -> make the corpus if it is the built-in one and
missing -> data module (tokenizers, feature stats) -> model -> Lightning fit -> test the best
checkpoint (`score_best_checkpoint`) -> results.json.
"""
from __future__ import annotations

import json
import logging
import time
from contextlib import contextmanager
from functools import partial
from pathlib import Path

import lightning as L
import torch
from hydra.core.hydra_config import HydraConfig
from lightning.pytorch.callbacks import Callback, EarlyStopping, ModelCheckpoint, Timer
from lightning.pytorch.loggers import CSVLogger, TensorBoardLogger
from lightning.pytorch.utilities.rank_zero import rank_zero_only
from omegaconf import DictConfig, OmegaConf

from asr.config.schema import validate_config
from asr.core.errors import ConfigError
from asr.data.corpus.corpus_recipes import corpus_preparer, corpus_recipe, preparation_hint, unregistered_note
from asr.data.corpus.corpus_summary import format_corpus_summary, summarise_split
from asr.data.config import DataConfig
from asr.data.corpus.corpus import Corpus
from asr.core.corpus_lock import writing_corpus_folder
from asr.data.datamodule import SpeechDataModule
from asr.data.corpus.manifests import manifest_name
from asr.evaluation.decoding.evaluation import out_of_vocabulary_report
from asr.evaluation.evaluation import lexicon_word_decoding, real_speech_rates
from asr.model.checkpoint import AtomicCheckpointIO
from asr.model.decoding_files import keep_decoding_files_in_run
from asr.model.diagnostics import TrainingDiagnostics
from asr.model.encoder import compile_encoder
from asr.model.graphed_encoder import graph_encoder
from asr.model.recognizer import SpeechRecognizer, check_state_dict_fits
from asr.model.run_folder import (check_launch_shares_run_folder, claim_run_folder, one_process_at_a_time,
                                  resolve_checkpoint)
from asr.training import adaptation
from asr.training.callbacks import (BatchRecorder, EpochCheckpoint, EpochTimer, LatestStepCheckpoint,
                                   RelativePlateauStop, StepCheckpoint, ValidateAtStepBudget, ValidationLog)
from asr.training.distributed import CollectiveTimeoutLine, apply_collective_timeout, check_launch_matches_trainer
from asr.training.progress import EpochProgressBar, StepBudgetEstimate
from asr.training.stop_checkpoint import CheckpointOnSigterm

log = logging.getLogger("asr.train")
# train.log only (asr.train's train_log_keeps_the_console): what the console gets by print,
# Lightning's table and a failure's traceback, which the console has in their own form.
file_log = logging.getLogger("asr.train.file")
file_log.propagate = False


def ensure_corpus(cfg: DictConfig, corpus: Corpus | None = None, run_dir: Path | None = None) -> None:
    """Generates a corpus whose manifests are missing when its recipe has a preparer
    (asr.data.corpus.corpus_recipes: the built-in synthetic corpus), logs a summary of it and writes the
    recipe's full report to <run_dir>/corpus_report.json; for any other corpus (the user's copy
    of WSJ, TIMIT, ...) missing manifests are a ConfigError naming the recipe command. `corpus`:
    the one resolved from cfg.data (resolved here when not given)."""
    corpus = corpus or Corpus.of(cfg.data)
    data, root = cfg.data, corpus.root
    # test=false never reads the test split, so a corpus without one trains
    splits = (data.train_split, data.dev_split) + ((data.test_split,) if cfg.test else ())
    missing = corpus.missing_splits(*splits)
    if not missing:
        return
    recipe = corpus_recipe(corpus.name)
    if recipe is None or recipe.preparer is None:   # a real corpus is the user's: say how to prepare it, never guess
        where = (f"data.root={str(root)!r} does not exist, so it holds no {corpus.name} manifests"
                 if not root.is_dir() else
                 f"data.root={str(root)!r} has no {manifest_name(corpus.name, 'cuts', '<split>')} for split(s) {missing}")
        raise ConfigError(f"{where}; {preparation_hint(corpus.name, root)}, then run again with "
                          f"data.root=<that folder> ({unregistered_note()})")
    log.info("corpus %s: manifests missing in %s, generating them (once)", corpus.name, root)
    # a config section may size the corpus (synth_corpus for the built-in one)
    options = OmegaConf.to_container(cfg[recipe.options_section], resolve=True) if recipe.options_section else {}
    try:
        # another run generating it meanwhile: this one waits, then its preparer finds the corpus done
        with writing_corpus_folder(root, f"generating corpus {corpus.name}"):
            report = recipe.preparer(root, progress=True, **options)
    except ValueError as error:   # an option value it refuses, or data.root made with other settings
        raise ConfigError(f"corpus {corpus.name} in data.root={str(root)!r}: {error}") from None
    # a split the preparer did not write is left to the data module, whose error names it
    written = [split for split in dict.fromkeys(splits) if split not in corpus.missing_splits(split)]
    lines = format_corpus_summary(corpus.name, {split: summarise_split(corpus, split) for split in written},
                                  data.train_split, data.test_split)
    if run_dir is not None:
        path = run_dir / "corpus_report.json"
        path.write_text(json.dumps(report, indent=1, default=str) + "\n")
        lines.append(f"  the recipe's full report: {path}")
    log.info("%s", "\n".join(lines))


def build_trainer(cfg: DictConfig, run_dir: Path, timer: EpochTimer
                  ) -> tuple[L.Trainer, ModelCheckpoint, ModelCheckpoint]:
    """The Trainer, and its checkpoints of the best (lowest primary error) and of the latest epoch."""
    t = cfg.trainer
    tensorboard = TensorBoardLogger(save_dir=str(run_dir), name="logs", default_hp_metric=False)
    csv = CSVLogger(save_dir=str(run_dir), name="logs", version=tensorboard.version)
    best = ModelCheckpoint(dirpath=run_dir / "checkpoints", filename="best", monitor="val/primary_error",
                           mode="min", save_top_k=1, enable_version_counter=False)
    # Not save_last=True: Lightning (2.6) rewrites that last.ckpt only in epochs where `best` improved,
    # so it could hold an older epoch than the latest one. A checkpoint without a monitor keeps the
    # newest epoch, rewritten at the end of every epoch (what ckpt_path=last resumes).
    latest = ModelCheckpoint(dirpath=run_dir / "checkpoints", filename="last", save_top_k=1,
                             enable_version_counter=False)
    callbacks: list[Callback] = [best, latest, timer, CollectiveTimeoutLine(), ValidationLog(),
                                 CheckpointOnSigterm(run_dir / "checkpoints")]   # docker stop, preemption
    if t.keep_epoch_checkpoints:   # for asr.average: each epoch's weights, with its validation rates
        callbacks.append(EpochCheckpoint(dirpath=run_dir / "checkpoints", filename="epoch-{epoch:03d}",
                                         save_top_k=-1, auto_insert_metric_name=False,
                                         enable_version_counter=False))
    if t.checkpoint_every_n_steps:   # mid-epoch resumes of long epochs
        callbacks.append(LatestStepCheckpoint(run_dir / "checkpoints", t.checkpoint_every_n_steps))
    if t.keep_checkpoints_every_n_steps:   # fixed steps, e.g. for recipes.synth.sharpening
        callbacks.append(StepCheckpoint(run_dir / "checkpoints", t.keep_checkpoints_every_n_steps))
    if t.enable_progress_bar:   # k/N with an ETA, and the time budget left (asr.training.progress)
        callbacks.append(EpochProgressBar())
    if t.max_steps > 0:   # the step budget's end: estimated (a log line early on, the bar), and validated
        callbacks += [StepBudgetEstimate(), ValidateAtStepBudget()]
    if t.record_batches:
        callbacks.append(BatchRecorder(run_dir / "batches"))
    if t.diagnostics_every_n_steps:
        callbacks.append(TrainingDiagnostics(t.diagnostics_every_n_steps, run_dir / "diagnostics.csv"))
    if t.early_stopping_patience and t.early_stopping_min_relative_gain is not None:
        callbacks.append(RelativePlateauStop("val/primary_error", t.early_stopping_patience,
                                             t.early_stopping_min_relative_gain, t.early_stopping_start_below))
    elif t.early_stopping_patience:
        callbacks.append(EarlyStopping(monitor="val/primary_error", mode="min",
                                       patience=t.early_stopping_patience))
    limits = {key: (int(value) if value > 1 else float(value))
              for key in ("limit_train_batches", "limit_val_batches", "limit_test_batches")
              if (value := t[key]) is not None}
    trainer = L.Trainer(
        # CSV first: it warns about a non-empty folder if TensorBoard has written there before it
        default_root_dir=str(run_dir), logger=[csv, tensorboard], callbacks=callbacks,
        max_epochs=t.max_epochs, max_steps=t.max_steps,
        max_time=None if t.max_minutes is None else {"minutes": float(t.max_minutes)},
        accelerator=t.accelerator, devices=t.devices, num_nodes=t.num_nodes, strategy=t.strategy,
        precision=t.precision,
        gradient_clip_val=cfg.optim.clip_norm or None, gradient_clip_algorithm="norm",
        log_every_n_steps=t.log_every_n_steps,
        val_check_interval=t.val_check_interval,   # None: after each epoch (and no info line about it)
        check_val_every_n_epoch=t.check_val_every_n_epoch, num_sanity_val_steps=t.num_sanity_val_steps,
        enable_progress_bar=t.enable_progress_bar, deterministic=t.deterministic,
        enable_model_summary=False,   # its table (FLOPs always 0 here) says less than asr.train's model line
        use_distributed_sampler=False,   # the data module's lhotse samplers shard by rank themselves
        plugins=[AtomicCheckpointIO()],
        **limits)
    apply_collective_timeout(trainer, t.ddp_timeout_minutes)
    return trainer, best, latest


@contextmanager
def ctrl_c_as_keyboard_interrupt(trainer: L.Trainer):
    """Lightning turns Ctrl-C inside fit and test into sys.exit(1) after its own clean shutdown;
    raise it again as the KeyboardInterrupt it was, so the command can exit with INTERRUPTED."""
    try:
        yield
    except SystemExit:
        if trainer.interrupted:
            raise KeyboardInterrupt from None
        raise


def train(cfg: DictConfig, run_dir: Path) -> dict:
    """Trains (or resumes) one run in `run_dir`, tests its best checkpoint, writes results.json."""
    started = time.perf_counter()
    # init_from: the trained model the run starts from; the config follows it from here on
    source = adaptation.adaptation_source(cfg, adaptation.command_line_overrides())
    # everything that can be checked is checked before the run folder gets anything of ours; the
    # attention and the data section as the run builds them, each checked here once
    attention, data = validate_config(cfg)
    check_launch_shares_run_folder(cfg.run_dir)
    check_launch_matches_trainer(cfg.trainer)
    if rank_zero_only.rank == 0 and run_dir.is_dir():   # before anything reads it: a second run stops here
        claim_run_folder(run_dir)
    resume_from, checkpoint = resolve_checkpoint(cfg.ckpt_path, run_dir)
    adaptation.check_resume(cfg, run_dir, resume_from)
    if source is not None:   # adapt.data_dir's Kaldi-style folders -> manifests, once
        adaptation.prepare_data(cfg, run_dir)
    corpus = Corpus.of(data)   # resolved once, handed down
    # A real corpus is the user's: only checked, here, before the run folder is made (its missing
    # manifests stop us); one with a preparer is generated later, once, under the corpus folder's lock.
    prepared_here = corpus_preparer(corpus.name) is not None
    if not prepared_here:
        ensure_corpus(cfg, corpus)
    if cfg.trainer.torch_threads:
        torch.set_num_threads(cfg.trainer.torch_threads)
    run_dir.mkdir(parents=True, exist_ok=True)
    if rank_zero_only.rank == 0:   # the processes of a multi-process run share the folder; one writes it
        claim_run_folder(run_dir)   # a folder made just now (one that existed was claimed above)
        (run_dir / "config.yaml").write_text(OmegaConf.to_yaml(cfg, resolve=True))
    L.seed_everything(cfg.seed, workers=True)
    datamodule = prepare_data(cfg, data, corpus, run_dir, checkpoint, generate_corpus=prepared_here, source=source)
    model = build_model(cfg, attention, datamodule)
    if checkpoint is not None:
        check_state_dict_fits(model, checkpoint["state_dict"], f"checkpoint {resume_from}")
        log.info("resuming from %s (epoch %s, step %s)", resume_from, checkpoint.get("epoch"),
                 checkpoint.get("global_step"))
        del checkpoint
    if source is not None:   # its weights (a resumed run's come from its checkpoint) and adapt.freeze
        adaptation.start_model(model, source, cfg.adapt.freeze, resuming=resume_from is not None)
    elif cfg.data.join_seconds and checkpoint is None:
        log.warning("data.join_seconds=%s from freshly drawn weights: such runs stayed on CTC's all-blank "
                    "plateau far longer than on one utterance per example (asr/RESULTS.md, 'Long recordings "
                    "in one pass'); train on utterances first, then join with init_from=RUN "
                    "(conf=synth_longform)", cfg.data.join_seconds)
    log.info("%s", model_line(model, attention))

    timer = EpochTimer()
    trainer, best, latest = build_trainer(cfg, run_dir, timer)
    with ctrl_c_as_keyboard_interrupt(trainer):
        trainer.fit(model, datamodule=datamodule, ckpt_path=str(resume_from) if resume_from else None)
    log.info("training stopped: %s", stop_reason(trainer))

    best_path = best.best_model_path or latest.best_model_path   # the latest one when nothing was validated
    results = training_results(cfg, run_dir, attention, model, trainer, timer, best, best_path)
    if cfg.test and best_path:
        results["test"] = score_best_checkpoint(trainer, model, datamodule, best_path)
        if trainer.is_global_zero and corpus.real_speech_test is not None:   # the honest number: real voices
            results["real_speech"] = real_speech_rates(best_path, corpus.real_speech_test, bool(cfg.data.progress))
    results["wall_seconds"] = time.perf_counter() - started   # of this start (a resumed run counts anew)
    if trainer.is_global_zero:   # every process has the same gathered error rates; one writes them
        (run_dir / "results.json").write_text(json.dumps(results, indent=2) + "\n")
    return results


def prepare_data(cfg: DictConfig, data: DataConfig, corpus: Corpus, run_dir: Path, checkpoint: dict | None,
                 generate_corpus: bool, source: adaptation.AdaptationSource | None = None) -> SpeechDataModule:
    """The data module of `data` (cfg.data, validated) and `corpus` (resolved from it), set up for
    fitting (and testing): the corpus generated if its recipe can and it must be, its lexicon and LM
    copied into the run folder, the tokenizers a resumed run's checkpoint has. A run from a trained
    model (`source`, init_from) takes that model's tokenizers, front-end, lexicon and LM."""
    # The processes of a multi-process run prepare the data together: each reads and checks the
    # manifests itself, all at once; what is written is written by one process at a time, and whoever
    # comes later finds it on disk: the built-in corpus and the feature cache and statistics under the
    # corpus's locks, which other runs on the corpus meet too (asr.core.corpus_lock; the data
    # module takes the cache's), the run's copies of the lexicon and LM under the run folder's
    # (asr.model.run_folder.one_process_at_a_time).
    preparation_lock = partial(one_process_at_a_time, run_dir / ".data_preparation.lock")
    datamodule = SpeechDataModule(data, frame_subsampling=cfg.model.subsampling, seed=cfg.seed,
                                  filterbank=source.frontend if source else None, corpus=corpus)
    if checkpoint is not None or source is not None:
        datamodule.set_tokenizers((checkpoint or source.checkpoint)["hyper_parameters"]["tokenizers"])
    with preparation_lock():
        if generate_corpus:
            ensure_corpus(cfg, corpus, run_dir)
        # the corpus's lexicon and LM travel with the run folder (asr.model.decoding_files.model_decoding_files)
        keep_decoding_files_in_run(run_dir, source.decoding_folder if source else corpus.root)
    datamodule.setup("fit")
    if cfg.test:   # the test split's features too, now, not concurrently by every process later
        datamodule.setup("test")
    return datamodule


def training_results(cfg: DictConfig, run_dir: Path, attention, model: SpeechRecognizer, trainer: L.Trainer,
                     timer: EpochTimer, best: ModelCheckpoint, best_path: str) -> dict:
    """results.json's training part: what ran, for how long, and the best validation."""
    return {
        "preset": _preset_name(), "run_dir": str(run_dir), "attention": attention.name,
        "attention_options": attention.options, "parameters": sum(p.numel() for p in model.parameters()),
        "epochs": trainer.current_epoch, "steps": trainer.global_step,
        "seconds_per_epoch": _mean([e["seconds"] for e in timer.epochs]),
        "train_seconds_per_epoch": _mean([e["train_seconds"] for e in timer.epochs]),
        "epoch_times": timer.epochs, "best_checkpoint": best_path,
        "best_val_primary_error": None if best.best_model_score is None else float(best.best_model_score),
        "val": getattr(model, "last_error_rates", {}).get("val", {}),
    }


def build_model(cfg: DictConfig, attention, datamodule: SpeechDataModule) -> SpeechRecognizer:
    """A new model for the config, its tokenizers and feature statistics from the data module."""
    model = SpeechRecognizer(
        model=OmegaConf.to_container(cfg.model, resolve=True),
        attention=attention,
        optim=OmegaConf.to_container(cfg.optim, resolve=True),
        feature_dim=datamodule.feature_dim,
        tokenizers={kind: tokenizer.state_dict() for kind, tokenizer in datamodule.tokenizers.items()},
        frontend=datamodule.filterbank.options)
    model.set_feature_stats(datamodule.feature_mean, datamodule.feature_std)
    if cfg.trainer.compile:
        compile_encoder(model.encoder)
    if cfg.trainer.cuda_graphs:   # asr/model/graphed_encoder.py
        graph_encoder(model.encoder)
    return model


def score_best_checkpoint(trainer: L.Trainer, model: SpeechRecognizer, datamodule: SpeechDataModule,
                          best_path: str) -> dict:
    """The end of training: the test split's error rates of the best checkpoint, and its words
    through the run's lexicon and LM when the corpus shipped them (wer_lexicon, cer_lexicon and
    oov_lm, the share of test words the LM does not know), all from one pass over the split."""
    log.info("test: scoring %s", best_path)
    word_decoding = lexicon_word_decoding(best_path, model.tokenizers)
    model.test_word_decoding = word_decoding
    try:
        with ctrl_c_as_keyboard_interrupt(trainer):   # verbose=False: asr.train prints each rate once itself
            trainer.test(model, datamodule=datamodule, ckpt_path=best_path, verbose=False)
    finally:
        model.test_word_decoding = None
        if word_decoding is not None:
            word_decoding.close()
    rates = dict(model.last_error_rates.get("test", {}))
    if word_decoding is not None and "wer_lexicon" in rates:
        rates["oov_lm"] = out_of_vocabulary_report(model.last_word_references, word_decoding.decoder.local)["lm"]
    for name, value in sorted(rates.items()):   # train.log keeps every number, the console a summary
        file_log.info("test/%-22s %s", name, value)
    return rates


def model_line(model: SpeechRecognizer, attention) -> str:
    """Lightning's model table in one line: 'model: 1,290,405 parameters (encoder 1,281,472, CTC heads
    phones, chars 8,933); attention iclustered (clusters=64, bits=63, iterations=10, topk=32)'."""
    def count(module) -> str:
        return f"{sum(p.numel() for p in module.parameters()):,}"
    options = ", ".join(f"{key}={value}" for key, value in attention.options.items())
    return (f"model: {count(model)} parameters (encoder {count(model.encoder)}, CTC heads "
            f"{', '.join(model.tokenizers)} {count(model.heads)}); attention {attention.name}"
            + (f" ({options})" if options else ""))


def stop_reason(trainer: L.Trainer) -> str:
    """Why fit returned: the time budget, early stopping, the step budget or the epochs."""
    where = f"after {trainer.current_epoch} epoch(s), {trainer.global_step} steps"
    timer = next((c for c in trainer.callbacks if isinstance(c, Timer)), None)
    if timer is not None and timer.time_remaining() is not None and timer.time_remaining() <= 0:
        return f"the time budget trainer.max_minutes={timer._duration / 60:g} ran out {where}"
    early = next((c for c in trainer.callbacks if isinstance(c, EarlyStopping)), None)
    if early is not None and early.stopped_epoch:
        return f"early stopping: no better {early.monitor} for {early.patience} validations, {where}"
    plateau = next((c for c in trainer.callbacks if isinstance(c, RelativePlateauStop)), None)
    if plateau is not None and plateau.stopped_step is not None:
        return (f"early stopping: no {100 * plateau.min_relative_gain:g} % relative gain in {plateau.monitor} for "
                f"{plateau.patience} validations, {where}")
    if trainer.max_steps is not None and 0 < trainer.max_steps <= trainer.global_step:
        return f"the step budget trainer.max_steps={trainer.max_steps} was reached {where}"
    if trainer.max_epochs is not None and 0 < trainer.max_epochs <= trainer.current_epoch:
        return f"trainer.max_epochs={trainer.max_epochs} epochs done ({trainer.global_step} steps)"
    return f"Lightning ended fit {where}"


def _mean(values: list[float]) -> float | None:
    return sum(values) / len(values) if values else None


def _preset_name() -> str | None:
    try:
        return HydraConfig.get().runtime.choices.get("conf")
    except ValueError:   # called outside Hydra (tests)
        return None

"""Train a CTC transformer: `python -m asr.train [conf=PRESET] [overrides ...]`.

    python -m asr.train                                    # preset synth_iclustered, built-in corpus
    python -m asr.train conf=synth_full trainer.max_epochs=5
    python -m asr.train conf=synth_full ckpt_path=last     # resume the newest synth_full run
    python -m asr.train conf=wsj_iclustered data.root=data/wsj   # a corpus prepared by recipes/wsj

One run = one folder (<run_root>/<preset>/<timestamp>, or run_dir=...):
    config.yaml             the resolved config (.hydra/ holds Hydra's own record and the overrides)
    checkpoints/best.ckpt   lowest validation error of the primary target; checkpoints/last.ckpt
    logs/version_N/         TensorBoard events and metrics.csv (one version per start or resume)
    results.json            test and best-validation PER/WER/CER, time per epoch, parameters, ...
    corpus_report.json      when the run generated its corpus (the built-in one): the recipe's report
    train.log               what the console showed but the progress bars, through the test result
                            and why training stopped, and a line per validation (each sitting
                            appends; train_ddp_process_N.log: process N > 0 of a
                            multi-process run; N is the local rank under Lightning's own launcher,
                            the global rank under torchrun or srun)
    batches/rankN.jsonl     with trainer.record_batches=true: the utterance ids of every batch
                            process N ran (BatchRecorder)
    decoding/               the corpus's lexicon.txt and lm/3gram.arpa.gz, when it has them: what
                            decoder=lexicon uses for this model from any folder (asr.evaluation.decoding.evaluation)

Several devices or machines (trainer.devices, trainer.num_nodes; Lightning's DDP): every process
runs this module; the data module gives each its share of every split, the recognizer gathers
validation and test transcripts from all of them, and process 0 writes results.json. Processes
started together by an outside launcher (torchrun, srun) prepare the data one at a time and must
share one run folder (see asr.model.run_folder.run_folder).

This module is the command: Hydra composes the config (the schema, asr/config/schema.py; the presets,
asr/config/presets.py), the run folder is named (asr/model/run_folder.py), `asr.training.fit.train` runs, and what
happened becomes an exit status (asr/core/exit_status.py) and the console's last lines.
"""
from __future__ import annotations

import logging
import os
import re
import shlex
import sys
from pathlib import Path

import hydra
from hydra.core.hydra_config import HydraConfig
from lightning.pytorch.utilities.rank_zero import rank_zero_only
from omegaconf import DictConfig, OmegaConf

from asr.config.schema import register_schema
from asr.core.errors import ConfigError, DiskFullError
from asr.core.output_paths import disk_full
from asr.config.help import schema_help
from asr.config.spelling import exit_on_misspelt_override
from asr.data.corpus.manifests import ManifestError
from asr.training.distributed import launched_rank, lost_process
from asr.core.exit_status import FAILURE, INTERRUPTED, USAGE_ERROR
from asr.text.metrics import percent
from asr.model.checkpoint import CheckpointError
from asr.model.recognizer import CheckpointMismatchError
from asr.model.run_folder import RunFolderInUseError, remove_unused_run_folder, run_folder
from asr.training.fit import file_log, train
from asr.core.warning_filters import install_warning_filters
from attention_ext import AttentionConfigError

# use_cache: Hydra may resolve hydra.run.dir more than once; the timestamp must not change.
OmegaConf.register_new_resolver("asr_run_dir", run_folder, use_cache=True, replace=True)
# --help's key table (conf/config.yaml, hydra.help.template), from the schema's comments
OmegaConf.register_new_resolver("asr_schema_help", schema_help, replace=True)
register_schema()


# ---- the console and train.log -------------------------------------------------------------------
def train_log_keeps_the_console() -> None:
    """The run folder's train.log (Hydra's file handler on the root logger) gets, besides our log
    lines: Lightning's (its logger does not propagate to the root: it got its own console handler
    when imported before Hydra set up logging), warnings that pass the filters, and through
    `file_log` what the console shows by print. Progress bars stay on the console only."""
    files = [handler for handler in logging.getLogger().handlers if isinstance(handler, logging.FileHandler)]
    for name in ("lightning.pytorch", "lightning.fabric"):
        logger = logging.getLogger(name)
        if not logger.propagate:
            for handler in files:
                if handler not in logger.handlers:
                    logger.addHandler(handler)
    logging.captureWarnings(True)   # py.warnings -> the root logger: the console's log lines and train.log
    file_log.handlers = files


def say(text: str, stream=None) -> None:
    """Print a line of the command's own (the result, an error, the resume hint) and keep it in train.log."""
    print(text, file=stream or sys.stdout)
    file_log.info(text.strip())


# ---- the command: exit statuses (asr.core.exit_status), the run folder of a run that never started --------
USAGE_ERRORS = (ConfigError, AttentionConfigError, CheckpointError, CheckpointMismatchError, ManifestError)
_task_started = False   # set by the Hydra task; before it, a failure is Hydra's composition of the config


def hydra_value(text: str) -> str:
    """`text` as a Hydra override value: as it is when plain, else quoted (a space, a comma or a
    bracket would otherwise split it or make it a sweep)."""
    if re.fullmatch(r"[\w./+-]+", text):
        return text
    return "'" + text.replace("'", "\\'") + "'"


def resume_hint(run_dir: Path) -> str:
    """How to continue an interrupted run: its own command with run_dir=<its folder> ckpt_path=last,
    or, before its first checkpoint, the same command again. Processes started by torchrun or
    srun cannot know the launcher's command: they name the arguments to add to it."""
    overrides = [o for o in HydraConfig.get().overrides.task
                 if not o.startswith(("ckpt_path=", "run_dir=", "+ckpt_path=", "+run_dir="))]
    if not (run_dir / "checkpoints" / "last.ckpt").is_file():
        return "no checkpoint had been written, so there is nothing to resume from; run the same command again"
    relative = os.path.relpath(run_dir)
    folder = str(run_dir) if relative.startswith("..") else relative
    if launched_rank() is not None:   # the processes may run on other machines, in other folders
        return (f"resume from its last checkpoint by starting the job again with "
                f"{shlex.quote(f'run_dir={hydra_value(str(run_dir.resolve()))}')} ckpt_path=last added to "
                "asr.train's arguments (on any number of processes)")
    command = " ".join(["python -m asr.train", *map(shlex.quote, overrides),
                        shlex.quote(f"run_dir={hydra_value(folder)}"), "ckpt_path=last"])
    return f"resume from its last checkpoint with: {command}"


@hydra.main(config_path="../conf", config_name="config", version_base="1.3")
def run(cfg: DictConfig) -> None:
    """The Hydra task: trains, and ends the process with the exit status of what happened."""
    global _task_started
    _task_started = True
    install_warning_filters()
    train_log_keeps_the_console()
    run_dir = Path(HydraConfig.get().runtime.output_dir)
    try:
        results = train(cfg, run_dir)
    except USAGE_ERRORS as error:
        if not isinstance(error, RunFolderInUseError):   # that folder is another run's
            remove_unused_run_folder(run_dir, cfg.run_dir)
        say(f"asr.train: error: {error}", sys.stderr)
        raise SystemExit(USAGE_ERROR) from None
    except KeyboardInterrupt:
        say(f"\nasr.train: interrupted; {resume_hint(run_dir)}", sys.stderr)
        raise SystemExit(INTERRUPTED) from None
    except Exception as error:   # the console gets Hydra's report of it; train.log the reason the run stopped
        file_log.exception("asr.train: stopped by an error")
        full = error if isinstance(error, DiskFullError) else disk_full(error, f"the run folder {run_dir}")
        if full is not None:   # one line naming the file, not torch's "unexpected pos"
            say(f"asr.train: error: {full}; {resume_hint(run_dir)}", sys.stderr)
            raise SystemExit(FAILURE) from None
        lost = lost_process(error)
        if lost is None:
            raise
        # a collective failed because another process of a multi-process run is gone: one line, no traceback
        say(f"asr.train: error: {lost}, so the run stopped; {resume_hint(run_dir)}", sys.stderr)
        raise SystemExit(FAILURE) from None
    if rank_zero_only.rank != 0:   # the other processes of a multi-device run stay quiet
        return
    say(f"\nrun folder: {run_dir}")
    lines = result_lines(results)
    if lines:
        say("\n".join(lines))


def result_lines(results: dict) -> list[str]:
    """The console's last lines, each rate once: the test split's headline PER, WER, CER (the phone
    head and the first word head, greedy), the lexicon + LM words, other heads if the model has more,
    and the real-speech line."""
    lines = []
    test = results.get("test") or {}
    if test:
        lines.append(f"test: PER {percent(test.get('per'))}  WER {percent(test.get('wer'))}  "
                     f"CER {percent(test.get('cer'))}  (mean encoder length {test.get('encoder_length', 0):.0f})")
        if "wer_lexicon" in test:
            lines.append(f"      lexicon + LM: WER {percent(test['wer_lexicon'])}  CER {percent(test['cer_lexicon'])}")
        # per head: per_<kind>, wer_<kind>, cer_<kind>; the first phone head and first word head are the headline
        heads = [key.split("_", 1)[1] for key in test
                 if key.startswith(("per_", "wer_")) and key not in ("wer_lexicon",)]
        phone_heads = [kind for kind in heads if f"per_{kind}" in test]
        word_heads = [kind for kind in heads if f"wer_{kind}" in test]
        others = ([f"{kind} PER {percent(test[f'per_{kind}'])}" for kind in phone_heads[1:]]
                  + [f"{kind} WER {percent(test[f'wer_{kind}'])} CER {percent(test.get(f'cer_{kind}'))}"
                     for kind in word_heads[1:]])
        if others:
            lines.append(f"      other heads: {'  '.join(others)}")
    real = results.get("real_speech") or {}
    if real:
        lines.append(f"real speech ({real['corpus']} test): PER {percent(real.get('per'))}"
                     + (f"  lexicon + LM: WER {percent(real['wer_lexicon'])}  (words outside the LM "
                        f"{percent(real['oov_lm'])})" if "wer_lexicon" in real else ""))
    return lines


def main() -> None:
    """python -m asr.train: Hydra's main with the project's exit statuses. Hydra exits with 1 for
    a config it cannot compose (an unknown key, a bad value type, a missing preset); that is a
    usage error (2). A failure inside the task stays 1."""
    exit_on_misspelt_override("asr.train", sys.argv[1:])
    rank = launched_rank()
    if rank:   # torchrun's or srun's other processes: a log of their own, Hydra's record written once
        sys.argv += [f"hydra.job.name=train_ddp_process_{rank}", "hydra.output_subdir=null"]
    try:
        run()
    except SystemExit as exit:
        if exit.code == FAILURE and not _task_started:
            raise SystemExit(USAGE_ERROR) from None
        raise
    except KeyboardInterrupt:   # before the task started (while Hydra composed the config)
        print("\nasr.train: interrupted", file=sys.stderr)
        raise SystemExit(INTERRUPTED) from None


if __name__ == "__main__":
    main()

"""Two-process DDP training on the CPU (gloo): `python -m asr.train trainer.devices=2 trainer.strategy=ddp`.

Lightning's "ddp" strategy starts the second process by running the same command again, so the
run is a subprocess. trainer.record_batches=true makes every process write the utterance ids of
each batch it ran (batches/rank<N>.jsonl); the test checks them against the manifests, and the
gathered validation PER against a single-process validation of the same checkpoint.
"""
from __future__ import annotations

import csv
import json
import os
import subprocess
import sys
from collections import Counter
from pathlib import Path

import lightning as L
import pytest
import torch
from lhotse import load_manifest
from omegaconf import OmegaConf

from asr.data.datamodule import SpeechDataModule
from asr.model.recognizer import SpeechRecognizer
from asr.config import ConfigError
from asr.run_folder import check_launch_shares_run_folder, run_folder
from asr.training import ensure_corpus
from tiny_runs import ROOT, TINY, compose_config


@pytest.fixture(scope="module")
def ddp_corpus(tmp_path_factory) -> Path:
    """The built-in corpus with 6 / 5 / 1 utterances: with two processes the dev split's last
    round and the single test utterance leave one process a padding batch."""
    root = tmp_path_factory.mktemp("synth_ddp")
    ensure_corpus(compose_config(f"data.root={root}", "synth_corpus.train_utterances=6",
                                 "synth_corpus.dev_utterances=5", "synth_corpus.test_utterances=1",
                                 "synth_corpus.jobs=1"))
    return root


def manifest_ids(root: Path, split: str) -> Counter:
    return Counter(cut.id for cut in load_manifest(root / f"synth_cuts_{split}.jsonl.gz"))


def recorded_batches(run: Path, rank: int) -> list[dict]:
    return [json.loads(line) for line in (run / "batches" / f"rank{rank}.jsonl").read_text().splitlines()]


def counted_ids(batches: list[dict]) -> Counter:
    return Counter(i for batch in batches if not batch["padding"] for i in batch["ids"])


def test_two_processes_split_the_data_and_gather_the_error_rates(ddp_corpus, tmp_path):
    run = tmp_path / "run"
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    for name in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "NODE_RANK", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(name, None)
    command = [sys.executable, "-m", "asr.train", "conf=synth_full", *TINY, f"data.root={ddp_corpus}",
               f"run_dir={run}", "trainer.max_epochs=2", "trainer.accelerator=cpu", "trainer.devices=2",
               "trainer.strategy=ddp", "trainer.record_batches=true", "trainer.torch_threads=1"]
    finished = subprocess.run(command, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert finished.returncode == 0, finished.stderr[-4000:]
    ranks = [recorded_batches(run, 0), recorded_batches(run, 1)]

    for stage, split, epochs in (("train", "train", (0, 1)), ("val", "dev", (0, 1)), ("test", "test", (2,))):
        for epoch in epochs:
            mine = [[b for b in batches if b["stage"] == stage and b["epoch"] == epoch] for batches in ranks]
            assert mine[0] and len(mine[0]) == len(mine[1]), (stage, epoch)   # in step: one batch each per step
            seen = [counted_ids(batches) for batches in mine]
            assert not set(seen[0]) & set(seen[1]), (stage, epoch)            # disjoint
            assert seen[0] + seen[1] == manifest_ids(ddp_corpus, split), (stage, epoch)   # all, each once
    # the lone test utterance went to process 0; process 1 ran a padding batch, not counted
    assert [b["padding"] for b in ranks[1] if b["stage"] == "test"] == [True]

    # the validation PER the two processes logged equals a single-process validation of the checkpoint
    results = json.loads((run / "results.json").read_text())
    with open(next(run.glob("logs/version_*/metrics.csv"))) as f:
        validations = [row for row in csv.DictReader(f) if row.get("val/per")]
    assert len(validations) == 2
    last = run / "checkpoints" / "last.ckpt"   # the latest epoch, also when its PER was not the best
    assert torch.load(last, map_location="cpu", weights_only=True)["global_step"] == results["steps"]
    model = SpeechRecognizer.load_from_checkpoint(last, map_location="cpu")
    cfg = OmegaConf.load(run / "config.yaml")
    data = SpeechDataModule(cfg.data, frame_subsampling=cfg.model.subsampling, seed=cfg.seed)
    data.set_tokenizers(model.hparams.tokenizers)
    single = L.Trainer(accelerator="cpu", devices=1, logger=False, enable_checkpointing=False,
                       enable_progress_bar=False, enable_model_summary=False, use_distributed_sampler=False)
    single.validate(model, datamodule=data, verbose=False)
    expected = model.last_error_rates["val"]
    assert 0 < expected["per"] and expected["per"] != 1.0          # not the all-blank (or perfect) output
    assert results["val"]["per"] == expected["per"] and results["val"]["wer"] == expected["wer"]
    assert float(validations[-1]["val/per"]) == pytest.approx(expected["per"], rel=1e-6)
    # the loss is a mean over utterances: the padding batches (weight 0) leave it unchanged
    assert float(validations[-1]["val/loss"]) == pytest.approx(single.callback_metrics["val/loss"].item(), rel=1e-4)


# ---- processes started by an outside launcher (torchrun, srun) share one run folder ---------------
LAUNCHER_VARIABLES = ("SLURM_STEP_NUM_TASKS", "SLURM_STEP_ID", "SLURM_JOB_ID", "WORLD_SIZE", "TORCHELASTIC_RUN_ID")


@pytest.mark.parametrize("variables, folder", [
    ({}, None),                                                            # a plain run: a timestamp
    ({"SLURM_STEP_NUM_TASKS": "8", "SLURM_STEP_ID": "2", "SLURM_JOB_ID": "4711"}, "slurm-4711-2"),
    ({"SLURM_STEP_NUM_TASKS": "1", "SLURM_JOB_ID": "4711"}, None),         # one task: Lightning starts the rest
    ({"SLURM_JOB_ID": "4711"}, None),                                      # in an allocation, not under srun
    ({"WORLD_SIZE": "4", "TORCHELASTIC_RUN_ID": "a1b2"}, "torchrun-a1b2"),
    ({"WORLD_SIZE": "4", "TORCHELASTIC_RUN_ID": "none"}, None),
])
def test_launched_processes_name_the_same_run_folder(variables, folder, monkeypatch, tmp_path):
    for name in LAUNCHER_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    for name, value in variables.items():
        monkeypatch.setenv(name, value)
    path = Path(run_folder(str(tmp_path), "synth_full", None, None))
    assert path.parent == tmp_path / "synth_full"
    if folder is None:
        assert path.name[:4].isdigit()          # <year>-<month>-<day>_<time>
    else:
        assert path.name == folder
    assert run_folder(str(tmp_path), "synth_full", "given", None) == "given"


def test_torchrun_without_a_rendezvous_id_needs_run_dir(monkeypatch):
    monkeypatch.setenv("WORLD_SIZE", "4")
    monkeypatch.setenv("TORCHELASTIC_RUN_ID", "none")
    with pytest.raises(ConfigError, match="give each the same run_dir=FOLDER"):
        check_launch_shares_run_folder(None)
    check_launch_shares_run_folder("/shared/runs/x")      # given: fine

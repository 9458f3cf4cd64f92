"""Two-process DDP training on the CPU (gloo): `python -m asr.train trainer.devices=2 trainer.strategy=ddp`.

Lightning's "ddp" strategy starts the second process by running the same command again, so the
run is a subprocess. trainer.record_batches=true makes every process write the utterance ids of
each batch it ran (batches/rank<N>.jsonl); the test checks them against the manifests, and the
gathered validation PER against a single-process validation of the same checkpoint.
"""
from __future__ import annotations

import csv
import errno
import fcntl
import json
import subprocess
import sys
import threading
import time
from collections import Counter
from functools import partial
from pathlib import Path

import pytest
import torch
from lhotse import load_manifest

from asr.config.schema import validate_config
from asr.core.errors import ConfigError
from asr.data.config import DataConfig
from asr.data.datamodule import SpeechDataModule
from asr.training.distributed import check_launch_matches_trainer, launched_rank, lost_process
from asr.model.run_folder import check_launch_shares_run_folder, one_process_at_a_time, run_folder
from tiny_runs import TINY, compose_config, subprocess_environment, validate_in_one_process


def manifest_ids(root: Path, split: str) -> Counter:
    return Counter(cut.id for cut in load_manifest(root / f"synth_cuts_{split}.jsonl.gz"))


def recorded_batches(run: Path, rank: int) -> list[dict]:
    return [json.loads(line) for line in (run / "batches" / f"rank{rank}.jsonl").read_text().splitlines()]


def counted_ids(batches: list[dict]) -> Counter:
    return Counter(i for batch in batches if not batch["padding"] for i in batch["ids"])


def test_two_processes_split_the_data_and_gather_the_error_rates(ddp_corpus, tmp_path):
    run = tmp_path / "run"
    env = subprocess_environment()
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
    expected, expected_loss = validate_in_one_process(run, last)
    assert 0 < expected["per"] and expected["per"] != 1.0          # not the all-blank (or perfect) output
    assert results["val"]["per"] == expected["per"] and results["val"]["wer"] == expected["wer"]
    assert float(validations[-1]["val/per"]) == pytest.approx(expected["per"], rel=1e-6)
    # the loss is a mean over utterances: the padding batches (weight 0) leave it unchanged
    assert float(validations[-1]["val/loss"]) == pytest.approx(expected_loss, rel=1e-4)


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


# ---- what a launcher's processes are told, and what a lost process looks like -------------------------
LAUNCH_VARIABLES = LAUNCHER_VARIABLES + ("RANK", "LOCAL_RANK", "SLURM_PROCID", "SLURM_NTASKS_PER_NODE", "SLURM_NNODES")


@pytest.mark.parametrize("variables, rank", [
    ({}, None),                                                                     # one process
    ({"LOCAL_RANK": "1", "WORLD_SIZE": "2"}, None),                                 # Lightning's own launcher
    ({"TORCHELASTIC_RUN_ID": "none", "WORLD_SIZE": "4", "RANK": "3", "LOCAL_RANK": "1"}, 3),   # torchrun
    ({"TORCHELASTIC_RUN_ID": "none", "WORLD_SIZE": "1", "RANK": "0"}, None),        # torchrun, one process
    ({"SLURM_JOB_ID": "7", "SLURM_STEP_NUM_TASKS": "8", "SLURM_PROCID": "5"}, 5),   # srun
    ({"SLURM_JOB_ID": "7", "SLURM_STEP_NUM_TASKS": "1", "SLURM_PROCID": "0"}, None),
])
def test_the_rank_a_launcher_gave(variables, rank, monkeypatch):
    for name in LAUNCH_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    for name, value in variables.items():
        monkeypatch.setenv(name, value)
    assert launched_rank() == rank


@pytest.mark.parametrize("variables, overrides, message", [
    ({"TORCHELASTIC_RUN_ID": "none", "WORLD_SIZE": "8"}, ["trainer.devices=2", "trainer.num_nodes=2"],
     r"trainer.devices=2 x trainer.num_nodes=2 = 4 processes, but torchrun started 8; give trainer.devices=<its "
     r"--nproc-per-node> and trainer.num_nodes=<its --nnodes>"),
    ({"TORCHELASTIC_RUN_ID": "none", "WORLD_SIZE": "8"}, ["trainer.devices=4", "trainer.num_nodes=2"], None),
    ({"TORCHELASTIC_RUN_ID": "none", "WORLD_SIZE": "8"}, ["trainer.devices=[0,1,2,3]", "trainer.num_nodes=2"], None),
    ({"TORCHELASTIC_RUN_ID": "none", "WORLD_SIZE": "8"}, ["trainer.devices=auto", "trainer.num_nodes=2"], None),
    ({"SLURM_STEP_NUM_TASKS": "8", "SLURM_NTASKS_PER_NODE": "4", "SLURM_NNODES": "2"},
     ["trainer.devices=8", "trainer.num_nodes=2"],
     r"trainer.devices=8 is not allowed: srun starts 4 tasks per node \(--ntasks-per-node\); give trainer.devices=4"),
    ({"SLURM_STEP_NUM_TASKS": "8", "SLURM_NTASKS_PER_NODE": "4", "SLURM_NNODES": "2"},
     ["trainer.devices=4", "trainer.num_nodes=1"],
     r"trainer.num_nodes=1 is not allowed: the job has 2 nodes \(--nodes\); give trainer.num_nodes=2"),
    ({"SLURM_STEP_NUM_TASKS": "8", "SLURM_NTASKS_PER_NODE": "4", "SLURM_NNODES": "2"},
     ["trainer.devices=4", "trainer.num_nodes=2"], None),
])
def test_the_trainer_must_count_the_processes_the_launcher_started(variables, overrides, message, monkeypatch):
    for name in LAUNCH_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    for name, value in variables.items():
        monkeypatch.setenv(name, value)
    trainer = compose_config(*overrides).trainer
    if message is None:
        check_launch_matches_trainer(trainer)
    else:
        with pytest.raises(ConfigError, match=message):
            check_launch_matches_trainer(trainer)


def test_the_collective_timeout_must_be_positive():
    with pytest.raises(ConfigError, match=r"trainer.ddp_timeout_minutes=0.0 is not allowed: must be a number of "
                                          r"minutes > 0"):
        validate_config(compose_config("trainer.ddp_timeout_minutes=0"))


@pytest.mark.parametrize("error, said", [
    # what gloo raised in the processes of runs whose other process was killed or stopped (seen here)
    (RuntimeError("[/__w/pytorch/pytorch/third_party/gloo/gloo/transport/tcp/pair.cc:537] Read error "
                  "[127.0.0.1]:23710: Connection reset by peer. This is typically caused by a remote worker hanging "
                  "or bugs in the application. Check the logs of the remote worker before reporting an error."),
     "another process of the run has ended: killed, out of memory, or its machine lost (Read error "
     "[127.0.0.1]:23710: Connection reset by peer)"),
    (RuntimeError("[/__w/pytorch/pytorch/third_party/gloo/gloo/transport/tcp/pair.cc:553] Connection closed by peer "
                  "[127.0.0.1]:8404. This is typically caused by a remote worker crashing."),
     "another process of the run has ended: killed, out of memory, or its machine lost (Connection closed "
     "by peer [127.0.0.1]:8404)"),
    (RuntimeError("[../third_party/gloo/gloo/transport/tcp/unbound_buffer.cc:81] Timed out waiting 60000ms for "
                  "recv operation to complete"),
     "another process of the run did not answer within trainer.ddp_timeout_minutes: it hangs, or its machine is "
     "unreachable (Timed out waiting 60000ms for recv operation to complete)"),
    (RuntimeError("CUDA out of memory. Tried to allocate 2.00 GiB"), None),
    (ValueError("gloo is a word"), None),
])
def test_a_collective_failed_by_a_lost_process_is_recognised(error, said):
    assert lost_process(error) == said


# ---- the processes of a run prepare the data: all read at once, one writes at a time ---------------------
def test_a_complete_feature_cache_is_read_without_the_lock_and_a_missing_one_written_under_it(ddp_corpus, tmp_path):
    lock_file, cache = tmp_path / "run" / ".data_preparation.lock", tmp_path / "features"
    data_config = DataConfig.of(compose_config(*TINY, "conf=synth_full", f"data.root={ddp_corpus}",
                                               f"data.cache_dir={cache}").data)

    def set_up_in_a_thread() -> tuple[threading.Thread, SpeechDataModule]:
        data = SpeechDataModule(data_config, frame_subsampling=2, cache_lock=partial(one_process_at_a_time, lock_file))
        thread = threading.Thread(target=data.setup, args=("fit",), daemon=True)
        thread.start()
        return thread, data

    lock_file.parent.mkdir()
    with open(lock_file, "a") as other_process:   # another process of the run holds the lock
        fcntl.flock(other_process, fcntl.LOCK_EX)
        writer, first = set_up_in_a_thread()
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline:        # the cache is empty: it waits for the lock, writing nothing
            assert writer.is_alive() and not list(cache.glob("*/*/shard-*"))
            time.sleep(0.1)
        fcntl.flock(other_process, fcntl.LOCK_UN)
        writer.join(120)
        assert not writer.is_alive() and list(cache.glob("*/train/shard-*.json"))

        fcntl.flock(other_process, fcntl.LOCK_EX)  # held again: the complete cache is read without it
        reader, second = set_up_in_a_thread()
        reader.join(120)
        assert not reader.is_alive()
    assert second.feature_stats.to_json() == first.feature_stats.to_json()
    assert second.split("train").features.store.index == first.split("train").features.store.index


def test_a_file_system_without_locks_is_named(tmp_path, monkeypatch):
    def refuse(*_):
        raise OSError(errno.ENOSYS, "Function not implemented")
    monkeypatch.setattr(fcntl, "flock", refuse)
    with pytest.raises(ConfigError, match=rf"the run folder {tmp_path} is on a file system without file locks \(flock: "
                                          r"Function not implemented\).*give run_dir= on a file system with them"):
        with one_process_at_a_time(tmp_path / ".data_preparation.lock"):
            pass

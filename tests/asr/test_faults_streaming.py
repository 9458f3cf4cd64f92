"""The fault suite on the streaming data path (data.streaming=true; tests/asr/test_faults.py is the
eager one, whose helpers this module uses): kill -9 while a split's shards are prepared and at
points of a streamed training, start again with ckpt_path=last, and check the result equals that
of a run nobody killed - the same final weights bit for bit, every training batch after a resume
the uninterrupted run's batch of that step (so no batch of an epoch is lost or repeated), the same
shards.

The tiny corpus (6 training utterances) is cut into shards of one utterance, batched two shards at a
time (data.stream_shard_cuts=1, data.stream_window_shards=2: three windows an epoch), so the epochs
take 4, 5 and 5 steps; trainer.checkpoint_every_n_steps=2 rewrites last.ckpt mid-epoch.
"""
from __future__ import annotations

import gzip
import json
from pathlib import Path
from unittest.mock import ANY

import pytest
import torch

from test_faults import copy_corpus, finish, kill_when, recorded_batches, start
from tiny_runs import TINY

STEPS_PER_EPOCH = (4, 5, 5)   # what the kill points below assume (checked on the uninterrupted run)
STEPS = sum(STEPS_PER_EPOCH)


def train_arguments(corpus: Path, run: Path) -> list[str]:
    return ["conf=synth_full", *TINY, f"data.root={corpus}", f"run_dir={run}", "data.streaming=true",
            "data.stream_shard_cuts=1", "data.stream_window_shards=2", "data.max_duration=18",
            "data.specaugment=true", f"trainer.max_epochs={len(STEPS_PER_EPOCH)}", "trainer.checkpoint_every_n_steps=2",
            "trainer.torch_threads=1", "trainer.record_batches=true", "test=false"]


def stream_folder(corpus: Path, split: str) -> Path:
    folders = list(corpus.glob(f"features/*/{split}/stream"))
    assert len(folders) == 1, folders
    return folders[0]


def checkpoint(run: Path, name: str = "last.ckpt") -> dict:
    return torch.load(run / "checkpoints" / name, map_location="cpu", weights_only=True)


def stream_position(saved: dict) -> dict | None:
    (state,) = [value for key, value in saved.items() if key.endswith("DataModule")]
    return state["stream_position"]


def of_stage(batches: list[dict], stage: str) -> list[dict]:
    return [b for b in batches if b["stage"] == stage]


def shard_contents(folder: Path) -> dict[str, object]:
    """Every file of a prepared stream, as what it holds: gzip members decompressed (their headers
    hold the time they were written) and the index without the manifest's path."""
    contents: dict[str, object] = {}
    for path in sorted(folder.iterdir()):
        data = path.read_bytes()
        if path.name.endswith(".gz"):
            data = gzip.decompress(data)
        if path.name == "index.json":
            data = {key: value for key, value in json.loads(data).items() if key != "manifest"}
        contents[path.name] = data
    return contents


@pytest.fixture(scope="module")
def uninterrupted_stream_run(tiny_synth, tmp_path_factory) -> Path:
    where = tmp_path_factory.mktemp("uninterrupted_stream")
    corpus, run = copy_corpus(tiny_synth, where / "corpus"), where / "run"
    finish("asr.train", *train_arguments(corpus, run), cwd=where)
    return run


def kill_preparing_shards(arguments: list[str], corpus: Path, run: Path, where: Path) -> dict[Path, int]:
    """(a) kill -9 while the training split's shards are written: two finished, the third without its
    summary; the finished shards' files with their mtimes."""
    process, marker = start("asr.train", *arguments, cwd=where, pause_at="stream_shard_summary:3")
    kill_when(process, marker.exists)
    train_stream = stream_folder(corpus, "train")
    finished = [train_stream / f"shard-{shard:06d}{suffix}" for shard in (0, 1)
                for suffix in (".lilcom", ".cuts.jsonl.gz", ".json")]
    assert all(path.is_file() for path in finished)
    assert (train_stream / "shard-000002.lilcom").is_file() and not (train_stream / "shard-000002.json").exists()
    assert not (train_stream / "index.json").exists() and not (run / "checkpoints").exists()
    return {path: path.stat().st_mtime_ns for path in finished}


def kill_at_a_checkpoint_write(arguments: list[str], run: Path, where: Path, replacement: int) -> list[dict]:
    """kill -9 while the `replacement`-th checkpoint write of the process that replaces a file is
    whole in its temporary file; the batches the process ran."""
    done = len(recorded_batches(run))
    process, marker = start("asr.train", *arguments, cwd=where, pause_at=f"checkpoint_replace:{replacement}")
    kill_when(process, marker.exists)
    assert list(run.glob("checkpoints/.*.tmp"))
    return recorded_batches(run)[done:]


def test_streamed_training_killed_four_times_ends_with_the_batches_and_weights_of_an_uninterrupted_run(
        uninterrupted_stream_run, tiny_synth, tmp_path):
    reference = recorded_batches(uninterrupted_stream_run)
    reference_train = of_stage(reference, "train")
    assert [sum(1 for b in reference_train if b["epoch"] == e) for e in range(3)] == list(STEPS_PER_EPOCH)
    assert any(len(b["ids"]) > 1 for b in reference_train) and not any(b["padding"] for b in reference_train)
    corpus, run = copy_corpus(tiny_synth, tmp_path / "corpus"), tmp_path / "run"
    arguments, resumed = train_arguments(corpus, run), [*train_arguments(corpus, run), "ckpt_path=last"]
    jobs = []   # (the global step it started from, the batches it ran)

    # (a) while the shards are written
    finished = kill_preparing_shards(arguments, corpus, run, tmp_path)
    # (b) at the end of the first epoch, while its checkpoint replaces the step checkpoint of step 2
    # (the first replacement): the first epoch's validation ran; its last step, step 4, wrote no step
    # checkpoint (asr.training.callbacks.LatestStepCheckpoint)
    jobs.append((0, kill_at_a_checkpoint_write(arguments, run, tmp_path, replacement=1)))
    assert {path: path.stat().st_mtime_ns for path in finished} == finished   # kept, not written again
    assert [b["batch"] for b in of_stage(jobs[-1][1], "train")] == [0, 1, 2, 3] and of_stage(jobs[-1][1], "val")
    assert checkpoint(run)["global_step"] == 2 and checkpoint(run, "best.ckpt")["global_step"] == 4
    # (c) mid-epoch: resumed from the first epoch's end (best.ckpt, the newest), killed while step 8's
    # checkpoint replaces step 6's (its second replacement): steps 7-8 ran after the checkpoint
    jobs.append((4, kill_at_a_checkpoint_write(resumed, run, tmp_path, replacement=2)))
    saved = checkpoint(run)
    assert saved["global_step"] == 6 and stream_position(saved) == {"epoch": 1, "consumed": ANY, "steps": 2}
    # (d) mid-epoch, the third step of the last epoch under way (waiting on the batch record): last.ckpt
    # is a step checkpoint of that epoch (step 10 or 12)
    done = len(recorded_batches(run))
    process, _ = start("asr.train", *resumed, cwd=tmp_path)
    kill_when(process, lambda: any(b["stage"] == "train" and b["epoch"] == 2 and b["batch"] == 2
                                   for b in recorded_batches(run)[done:]))
    jobs.append((6, recorded_batches(run)[done:]))
    saved = checkpoint(run)
    assert saved["global_step"] in (10, 12) and stream_position(saved)["epoch"] == 2
    # and to the end
    done = len(recorded_batches(run))
    output = finish("asr.train", *resumed, cwd=tmp_path)
    assert f"last.ckpt (epoch 2, step {saved['global_step']})" in output
    jobs.append((saved["global_step"], recorded_batches(run)[done:]))
    assert json.loads((run / "results.json").read_text())["steps"] == STEPS

    expected, got = checkpoint(uninterrupted_stream_run)["state_dict"], checkpoint(run)["state_dict"]
    assert expected.keys() == got.keys()
    for name in expected:
        assert torch.equal(got[name], expected[name]), name
    # each job's training batches (epoch, index in it, ids) are the uninterrupted run's from where it started
    for step, batches in jobs:
        train = of_stage(batches, "train")
        assert train == reference_train[step:step + len(train)], step
    assert len(of_stage(jobs[-1][1], "train")) == STEPS - saved["global_step"]
    # each epoch validated on what the uninterrupted run validated
    validations = [[b for b in of_stage(reference, "val") if b["epoch"] == epoch] for epoch in range(3)]
    assert [of_stage(batches, "val") for _, batches in jobs] == [validations[0], [], validations[1], validations[2]]
    # the shards the killed preparation left are those of an uninterrupted preparation
    for split in ("train", "dev"):
        expected_shards = shard_contents(stream_folder(uninterrupted_stream_run.parent / "corpus", split))
        got_shards = shard_contents(stream_folder(corpus, split))
        assert sorted(got_shards) == sorted(expected_shards) and "index.json" in got_shards
        for name in expected_shards:
            assert got_shards[name] == expected_shards[name], (split, name)

"""asr.train's AtomicCheckpointIO: a checkpoint file is the old one or the new one, whole, whatever happens."""
from __future__ import annotations

import pytest
import torch

from asr import train as train_module
from asr.train import AtomicCheckpointIO


def test_a_write_replaces_the_checkpoint_whole(tmp_path):
    path = tmp_path / "checkpoints" / "last.ckpt"
    io = AtomicCheckpointIO()
    io.save_checkpoint({"step": 1, "weights": torch.arange(4)}, path)
    io.save_checkpoint({"step": 2, "weights": torch.arange(8)}, path)
    loaded = torch.load(path, weights_only=True)
    assert loaded["step"] == 2 and torch.equal(loaded["weights"], torch.arange(8))
    assert sorted(p.name for p in path.parent.iterdir()) == ["last.ckpt"]   # no temporary left


def test_a_write_that_dies_halfway_leaves_the_old_checkpoint(tmp_path, monkeypatch):
    path = tmp_path / "last.ckpt"
    io = AtomicCheckpointIO()
    io.save_checkpoint({"step": 1}, path)
    old_bytes = path.read_bytes()

    def dies_halfway(obj, handle):
        handle.write(b"PK\x03\x04 half a checkpoint")   # bytes reach the disk, then the process "dies"
        raise KeyboardInterrupt

    monkeypatch.setattr(train_module.torch, "save", dies_halfway)
    with pytest.raises(KeyboardInterrupt):
        io.save_checkpoint({"step": 2}, path)
    assert path.read_bytes() == old_bytes
    assert [p.name for p in tmp_path.iterdir()] == ["last.ckpt"]


def test_training_writes_its_checkpoints_through_it(tiny_synth, tmp_path, monkeypatch):
    written = []
    original = AtomicCheckpointIO.save_checkpoint

    def recording(self, checkpoint, path, storage_options=None):
        written.append(path)
        return original(self, checkpoint, path, storage_options)

    monkeypatch.setattr(AtomicCheckpointIO, "save_checkpoint", recording)
    from tiny_runs import tiny_config
    train_module.train(tiny_config(tiny_synth, "conf=synth_full", "test=false"), tmp_path / "run")
    assert {p.rsplit("/", 1)[-1] for p in map(str, written)} == {"best.ckpt", "last.ckpt"}

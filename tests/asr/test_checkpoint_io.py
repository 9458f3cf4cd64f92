"""AtomicCheckpointIO (asr.model.checkpoint), which asr.train writes with: a checkpoint file is the old one or the new one, whole, whatever happens."""
from __future__ import annotations

import pytest
import torch

from asr.training import fit as training
from asr.model import checkpoint as checkpoint_module
from asr.model.checkpoint import AtomicCheckpointIO


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

    monkeypatch.setattr(checkpoint_module.torch, "save", dies_halfway)
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
    training.train(tiny_config(tiny_synth, "conf=synth_full", "test=false"), tmp_path / "run")
    assert {p.rsplit("/", 1)[-1] for p in map(str, written)} == {"best.ckpt", "last.ckpt"}


# ---- a damaged checkpoint: ckpt_path=last falls back, a direct read names what can be used -------
def test_a_damaged_last_checkpoint_falls_back_to_the_newest_usable_one(tiny_synth, tmp_path, caplog):
    from asr.model.checkpoint import CheckpointError, read_checkpoint
    from tiny_runs import tiny_config
    run = tmp_path / "run"
    common = ("conf=synth_full", "test=false")
    first = training.train(tiny_config(tiny_synth, *common, "trainer.max_epochs=2"), run)
    last, best = run / "checkpoints" / "last.ckpt", run / "checkpoints" / "best.ckpt"
    steps_per_epoch = first["steps"] // 2
    best_step = torch.load(best, weights_only=True)["global_step"]
    last.write_bytes(last.read_bytes()[:1000])   # damaged by something else than our writer
    (run / "checkpoints" / ".last.ckpt.x1y2.tmp").write_bytes(b"PK\x03\x04 half")   # a killed write's leftover

    with pytest.raises(CheckpointError) as error:
        read_checkpoint(last)
    message = str(error.value)
    assert "\n" not in message and message.startswith(f"checkpoint {last} is not a PyTorch checkpoint")
    assert message.endswith(f"checkpoints in the same folder that can be used (newest first): {best}")

    caplog.set_level("WARNING", logger="asr.train")
    resumed = training.train(tiny_config(tiny_synth, *common, "trainer.max_epochs=3", "ckpt_path=last"), run)
    said = caplog.text
    assert f"passing over checkpoint {last} is not a PyTorch checkpoint" in said
    assert f"resuming from {best}, the newest checkpoint that can be used" in said
    assert resumed["steps"] == 3 * steps_per_epoch and best_step in (steps_per_epoch, 2 * steps_per_epoch)
    assert torch.load(last, weights_only=True)["global_step"] == 3 * steps_per_epoch   # whole again
    assert not list(run.glob("checkpoints/.*.tmp"))


def test_no_usable_checkpoint_names_every_file_and_its_problem(tiny_synth, tmp_path):
    from asr.model.checkpoint import CheckpointError
    from tiny_runs import tiny_config
    run = tmp_path / "run"
    (run / "checkpoints").mkdir(parents=True)
    (run / "checkpoints" / "last.ckpt").write_text("")
    (run / "checkpoints" / "best.ckpt").write_text("not a checkpoint")
    with pytest.raises(CheckpointError) as error:
        training.train(tiny_config(tiny_synth, "conf=synth_full", "ckpt_path=last"), run)
    message = str(error.value)
    assert message.startswith(f"no checkpoint in {run / 'checkpoints'} can be used: ")
    assert f"checkpoint {run / 'checkpoints' / 'last.ckpt'} is not a PyTorch checkpoint" in message
    assert f"checkpoint {run / 'checkpoints' / 'best.ckpt'} is not a PyTorch checkpoint" in message


def test_a_run_killed_before_its_first_checkpoint_starts_again_with_ckpt_path_last(tiny_synth, tmp_path, caplog):
    from tiny_runs import tiny_config
    run = tmp_path / "run"
    run.mkdir()
    (run / "config.yaml").write_text("# written at the start of a run that was killed before its first epoch ended\n")
    caplog.set_level("WARNING", logger="asr.train")
    result = training.train(tiny_config(tiny_synth, "conf=synth_full", "test=false", "trainer.max_steps=1",
                                            "ckpt_path=last"), run)
    assert result["steps"] == 1
    assert "has no checkpoint yet (the run stopped before its first one); starting it from the beginning" in caplog.text


# ---- Lightning's own read of a checkpoint is as safe as ours ---------------------------------------
class _WritesAMarker:
    """Unpickled, it opens (creates) the marker file: a stand-in for a pickle that runs any code."""

    def __init__(self, marker):
        self.marker = str(marker)

    def __reduce__(self):
        return open, (self.marker, "w")


def test_lightnings_read_refuses_a_pickle_that_runs_code_even_when_torch_is_told_to_allow_it(tmp_path,
                                                                                            monkeypatch):
    from asr.model.checkpoint import CheckpointError
    marker, path = tmp_path / "ran", tmp_path / "last.ckpt"
    torch.save({"state_dict": {}, "payload": _WritesAMarker(marker)}, path)
    monkeypatch.setenv("TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD", "1")
    with pytest.raises(CheckpointError, match="holds Python objects besides tensors"):
        AtomicCheckpointIO().load_checkpoint(path)   # what trainer.fit(ckpt_path=...) calls
    assert not marker.exists()


def test_a_checkpoint_swapped_after_our_own_check_runs_no_code_on_resume(tiny_synth, tmp_path, monkeypatch):
    """The file asr.train resumes from is checked (resolve_checkpoint), then opened again by Lightning:
    a file swapped in between is refused by that second read too."""
    from asr.model.checkpoint import CheckpointError
    from tiny_runs import tiny_config
    run, marker = tmp_path / "run", tmp_path / "ran"
    common = ("conf=synth_full", "test=false")
    training.train(tiny_config(tiny_synth, *common), run)
    checked = training.resolve_checkpoint

    def check_then_swap(ckpt_path, run_dir):
        resume_from, checkpoint = checked(ckpt_path, run_dir)
        torch.save({"state_dict": {}, "payload": _WritesAMarker(marker)}, resume_from)
        return resume_from, checkpoint

    monkeypatch.setattr(training, "resolve_checkpoint", check_then_swap)
    monkeypatch.setenv("TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD", "1")
    with pytest.raises(CheckpointError, match="holds Python objects besides tensors"):
        training.train(tiny_config(tiny_synth, *common, "trainer.max_epochs=2", "ckpt_path=last"), run)
    assert not marker.exists()

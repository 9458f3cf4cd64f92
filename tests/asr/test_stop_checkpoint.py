"""asr.training.stop_checkpoint: SIGTERM during fit (docker stop through tini, a preemption) leaves
checkpoints/last.ckpt at the step it stopped, and a fit resumed from it goes on from that step."""
from __future__ import annotations

import os
import signal

import lightning as L
import pytest
import torch
from lightning.pytorch.callbacks import Callback

from asr.training.stop_checkpoint import CheckpointOnSigterm


class Regression(L.LightningModule):
    def __init__(self):
        super().__init__()
        self.layer = torch.nn.Linear(4, 1)

    def training_step(self, batch, batch_index):
        inputs, targets = batch
        return torch.nn.functional.mse_loss(self.layer(inputs), targets)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)

    def train_dataloader(self):
        generator = torch.Generator().manual_seed(0)
        inputs = torch.randn(64, 4, generator=generator)
        dataset = torch.utils.data.TensorDataset(inputs, inputs.sum(dim=1, keepdim=True))
        return torch.utils.data.DataLoader(dataset, batch_size=4)   # 16 steps an epoch


class SigtermAtStep(Callback):
    """Sends this process SIGTERM after the given optimiser step, as `docker stop` would."""

    def __init__(self, step: int):
        self.step = step

    def on_train_batch_end(self, trainer, *args):
        if trainer.global_step == self.step:
            os.kill(os.getpid(), signal.SIGTERM)


def trainer(tmp_path, *callbacks, max_steps=12):
    return L.Trainer(default_root_dir=tmp_path, max_steps=max_steps, logger=False, enable_checkpointing=False,
                     enable_progress_bar=False, enable_model_summary=False, accelerator="cpu",
                     callbacks=[CheckpointOnSigterm(tmp_path / "checkpoints"), *callbacks])


def test_sigterm_mid_epoch_saves_last_ckpt_and_the_resumed_fit_goes_on_from_its_step(tmp_path):
    before = signal.getsignal(signal.SIGTERM)
    stopped = trainer(tmp_path, SigtermAtStep(5))
    with pytest.raises(SystemExit):   # Lightning's SIGTERMException, after the running step
        stopped.fit(Regression())
    assert signal.getsignal(signal.SIGTERM) == before   # Lightning put the handler back
    saved = torch.load(tmp_path / "checkpoints" / "last.ckpt", weights_only=False)
    assert saved["global_step"] == 5 and saved["epoch"] == 0   # mid-epoch: no epoch-end checkpoint yet
    assert torch.equal(saved["state_dict"]["layer.weight"], stopped.lightning_module.layer.weight.detach())

    steps_seen = []

    class FirstStep(Callback):
        def on_train_batch_start(self, trainer, *args):
            steps_seen.append(trainer.global_step)

    resumed = trainer(tmp_path, FirstStep())
    resumed.fit(Regression(), ckpt_path=tmp_path / "checkpoints" / "last.ckpt")
    assert steps_seen[0] == 5 and resumed.global_step == 12


def test_an_error_other_than_sigterm_writes_nothing(tmp_path):
    class Broken(Regression):
        def training_step(self, batch, batch_index):
            raise ValueError("broken step")

    with pytest.raises(ValueError):
        trainer(tmp_path).fit(Broken())
    assert not (tmp_path / "checkpoints").exists()


def final_weights(run):
    return torch.load(run / "checkpoints" / "last.ckpt", weights_only=True)["state_dict"]


STREAMED = ["data.streaming=true", "data.stream_shard_cuts=1", "data.stream_window_shards=2", "data.max_duration=18"]


@pytest.mark.parametrize("data", [[], STREAMED], ids=["bucketed", "streamed"])
def test_a_run_resumed_inside_an_epoch_goes_on_with_that_epochs_batches(tiny_synth, tmp_path, data):
    """Stopped by its step budget after 2 steps (last.ckpt every step) and resumed to 6, the run
    trains the rest of epoch 0 and then epoch 1's first batches, the batches of a run nobody stopped
    (it had replayed the epoch from its first batch), and ends with that run's weights bit for bit.
    Lightning counts an epoch stopped by trainer.max_steps as done and, resumed, sets the samplers'
    next epoch while epoch 0's rest is drawn: that rest kept epoch 0's order but took epoch 1's
    SpecAugment draws (and a streamed epoch its position)."""
    import json

    from asr.training.fit import train
    from test_faults import copy_corpus
    from tiny_runs import tiny_config

    if data == STREAMED:   # streaming shards in a corpus folder make data.streaming=auto stream it: a copy
        tiny_synth = copy_corpus(tiny_synth, tmp_path / "corpus")
    common = ["trainer.checkpoint_every_n_steps=1", "trainer.max_epochs=-1", "trainer.val_check_interval=null",
              "trainer.record_batches=true", "test=false", *data]

    def trained(run):
        lines = map(json.loads, (run / "batches" / "rank0.jsonl").read_text().splitlines())
        return [(line["epoch"], line["batch"], line["ids"]) for line in lines if line["stage"] == "train"]

    uninterrupted, stopped = tmp_path / "uninterrupted", tmp_path / "stopped"
    train(tiny_config(tiny_synth, *common, "trainer.max_steps=6"), uninterrupted)
    train(tiny_config(tiny_synth, *common, "trainer.max_steps=2"), stopped)
    saved = torch.load(stopped / "checkpoints" / "last.ckpt", weights_only=True)
    assert saved["global_step"] == 2 and saved["SpeechDataModule"]["next_train_epoch"] == 0
    if not data:
        assert saved["SpeechDataModule"]["epoch_batches_done"] == 2
    train(tiny_config(tiny_synth, *common, "trainer.max_steps=6", "ckpt_path=last"), stopped)
    assert [epoch for epoch, _, _ in trained(uninterrupted)][:3] == [0, 0, 0]
    assert 1 in [epoch for epoch, _, _ in trained(uninterrupted)]
    assert trained(stopped) == trained(uninterrupted)
    expected, got = final_weights(uninterrupted), final_weights(stopped)
    assert got.keys() == expected.keys() and all(torch.equal(got[name], weights) for name, weights in expected.items())


def test_a_run_resumed_from_a_step_checkpoint_ends_with_the_weights_of_an_uninterrupted_one(tiny_synth, tmp_path):
    """A checkpoint written after a step inside an epoch (here a kept one, step 3 of the tiny corpus's
    4-batch epoch; trainer.checkpoint_every_n_steps and a SIGTERM's are written at the same point),
    resumed to the same step budget: the same final weights, bit for bit."""
    from asr.training.fit import train
    from tiny_runs import tiny_config

    common = ["trainer.max_epochs=-1", "trainer.val_check_interval=null", "test=false",
              "trainer.keep_checkpoints_every_n_steps=3", "trainer.max_steps=6"]
    uninterrupted, resumed = tmp_path / "uninterrupted", tmp_path / "resumed"
    train(tiny_config(tiny_synth, *common), uninterrupted)
    step_3 = uninterrupted / "checkpoints" / "step-000003.ckpt"
    assert torch.load(step_3, weights_only=True)["SpeechDataModule"] == {"next_train_epoch": 0, "epoch_batches_done": 3}
    train(tiny_config(tiny_synth, *common, f"ckpt_path={step_3}"), resumed)

    expected, got = final_weights(uninterrupted), final_weights(resumed)
    assert got.keys() == expected.keys() and all(torch.equal(got[name], weights) for name, weights in expected.items())

"""One DDP optimiser step against the single-process arithmetic: where they must be equal, and what
a step is where they are not.

The loss of a batch is the mean over its utterances of each utterance's CTC loss divided by its
target length (summed over the heads with model.loss_weights: asr.model.ctc.ctc_loss), and DDP
averages the gradients of the processes. A step on N processes, process r with a batch B_r of n_r
utterances, therefore follows

    g_DDP = (1/N) sum_r (1/n_r) sum_{i in B_r} grad l_i,

and one process given the union U of those batches follows g_U = (1/|U|) sum_{i in U} grad l_i.
They are the same gradient when every process's batch holds the same number of utterances
(n_r = |U|/N), and then the same step: RAdam, weight decay and clipping all act on the averaged
gradient, after DDP's all-reduce. When the sizes differ, an utterance of a smaller batch weighs more;
in particular a process's *padding* batch (asr.data.batching.duration_buckets: an epoch's last round with fewer
utterances than processes) contributes a zero gradient yet counts in the average, so that step
follows (processes with data / N) times the gradient of the union. Both sides must also compute the
same forward: dropout 0, SpecAugment off (its masks are drawn per batch, from the batch's ids), no
waveform augmentation, an attention without random draws (full); float rounding aside.

The run: 5 training utterances, batches of 2 (one duration bucket), 2 processes: an epoch is a round
of two batches of 2, then a round of one utterance and a padding batch. Steps 2 (padding) and 3
(equal sizes) are recomputed here, in one process, from the checkpoints of steps 1 and 2 (weights
and RAdam's state) and the gradients of the batches each process recorded.
"""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from lhotse import CutSet, load_manifest
from omegaconf import OmegaConf

from asr.data.config import DataConfig
from asr.data.datamodule import SpeechDataModule
from asr.data.batching.dataset import SpeechBatchDataset
from asr.model.recognizer import SpeechRecognizer
from tiny_runs import TINY, subprocess_environment

UTTERANCES, STEPS = 5, 3


@pytest.fixture(scope="module")
def two_process_run(tiny_synth, tmp_path_factory) -> Path:
    """Three steps of synth_full on 2 processes (gloo), with the checkpoint of every step."""
    where = tmp_path_factory.mktemp("ddp_step")
    cuts = list(load_manifest(tiny_synth / "synth_cuts_train.jsonl.gz"))[:UTTERANCES]
    # one bucket bounded by the longest utterance (asr.data.batching.duration_buckets): floor(2.5) = 2 utterances a batch
    max_duration = 2.5 * (max(cut.duration for cut in cuts) + 1e-3)
    run = where / "run"
    command = [sys.executable, "-m", "asr.train", "conf=synth_full", *TINY, f"data.root={tiny_synth}", f"run_dir={run}",
               f"data.max_train_utterances={UTTERANCES}", "data.num_buckets=1", f"data.max_duration={max_duration}",
               "data.specaugment=false", "model.dropout=0", "optim.warmup_steps=0", "optim.clip_norm=0",
               "trainer.max_epochs=2", f"trainer.max_steps={STEPS}", "trainer.keep_checkpoints_every_n_steps=1",
               "trainer.accelerator=cpu", "trainer.devices=2", "trainer.strategy=ddp", "trainer.record_batches=true",
               "trainer.torch_threads=1", "test=false"]
    finished = subprocess.run(command, cwd=where, env=subprocess_environment(), capture_output=True, text=True,
                              timeout=300)
    assert finished.returncode == 0, finished.stderr[-4000:]
    return run


def step_checkpoint(run: Path, step: int) -> dict:
    return torch.load(run / "checkpoints" / f"step-{step:06d}.ckpt", map_location="cpu", weights_only=True)


def training_batches(run: Path, rank: int) -> list[dict]:
    lines = (run / "batches" / f"rank{rank}.jsonl").read_text().splitlines()
    return [batch for batch in map(json.loads, lines) if batch["stage"] == "train"]


class OneProcess:
    """The model of a step's checkpoint, the batches of given utterances, their gradients and the
    optimiser step, computed in this process as one process would."""

    def __init__(self, run: Path):
        self.run = run
        cfg = OmegaConf.load(run / "config.yaml")
        self.data = SpeechDataModule(DataConfig.of(cfg.data), frame_subsampling=cfg.model.subsampling, seed=cfg.seed)
        self.cuts = None

    def model(self, step: int) -> SpeechRecognizer:
        model = SpeechRecognizer.load_from_checkpoint(self.run / "checkpoints" / f"step-{step:06d}.ckpt",
                                                      map_location="cpu")
        if self.cuts is None:
            self.data.set_tokenizers(model.hparams.tokenizers)
            train = self.data.split(self.data.cfg.train_split)
            self.cuts = {cut.id: cut for cut in train.cuts}
            self.dataset = SpeechBatchDataset(self.data.tokenizers, train.features)
        return model.train()

    def gradient(self, step: int, ids: list[str]) -> dict[str, torch.Tensor]:
        """The gradient of the training loss on the batch of `ids` at the weights after `step`."""
        model = self.model(step)
        if not ids:
            return {name: torch.zeros_like(p) for name, p in model.named_parameters()}
        loss = model._losses(self.dataset[CutSet.from_cuts(self.cuts[i] for i in ids)])[0]
        loss.backward()
        return {name: p.grad.clone() for name, p in model.named_parameters()}

    def optimiser_step(self, step: int, gradient: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """The weights one RAdam step with `gradient` makes from those after `step` (with its state)."""
        model = self.model(step)
        optimiser = model.configure_optimizers()   # RAdam as training builds it
        optimiser.load_state_dict(step_checkpoint(self.run, step)["optimizer_states"][0])
        for name, parameter in model.named_parameters():
            parameter.grad = gradient[name].clone()
        optimiser.step()
        return {name: p.detach().clone() for name, p in model.named_parameters()}


def gradient_the_run_took(run: Path, step: int, names: list[str]) -> dict[str, torch.Tensor]:
    """The gradient of step `step` read back from RAdam's first moments: m_t = b1 m_(t-1) + (1 - b1) g_t."""
    before, after = (step_checkpoint(run, s)["optimizer_states"][0] for s in (step - 1, step))
    beta1 = after["param_groups"][0]["betas"][0]
    return {name: (after["state"][i]["exp_avg"] - beta1 * before["state"][i]["exp_avg"]) / (1 - beta1)
            for i, name in enumerate(names)}


def largest(tensors: dict[str, torch.Tensor]) -> float:
    return max(float(t.abs().max()) for t in tensors.values())


def assert_same(got: dict[str, torch.Tensor], expected: dict[str, torch.Tensor], what: str) -> None:
    scale = largest(expected)
    for name in expected:
        torch.testing.assert_close(got[name], expected[name], rtol=1e-4, atol=1e-4 * scale, msg=f"{what}: {name}")


def differ(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    """The largest difference between a and b, relative to b's largest value."""
    return max(float((a[name] - b[name]).abs().max()) for name in b) / largest(b)


def test_a_ddp_step_is_the_mean_of_the_processes_batch_gradients(two_process_run):
    run = two_process_run
    ranks = [training_batches(run, 0), training_batches(run, 1)]
    counted = [[[] if batch["padding"] else batch["ids"] for batch in batches[:STEPS]] for batches in ranks]
    # what the run must have drawn for the two cases below: (2, 2) utterances, then (1, padding), then (2, 2)
    assert [(len(a), len(b)) for a, b in zip(*counted)] == [(2, 2), (1, 0), (2, 2)]
    assert [batch["padding"] for batch in ranks[1][:STEPS]] == [False, True, False]
    one = OneProcess(run)
    names = [name for name, _ in one.model(1).named_parameters()]

    for step in (2, 3):
        before = step_checkpoint(run, step - 1)["state_dict"]
        after = step_checkpoint(run, step)["state_dict"]
        ids = [counted[0][step - 1], counted[1][step - 1]]
        per_process = [one.gradient(step - 1, batch_ids) for batch_ids in ids]
        mean_of_batches = {name: (per_process[0][name] + per_process[1][name]) / 2 for name in names}
        union = one.gradient(step - 1, ids[0] + ids[1])
        took = gradient_the_run_took(run, step, names)
        assert largest(took) > 1e-3   # a real gradient, far above the tolerances below
        if step == 3:                 # the two batches pull apart: their mean is neither one alone
            assert differ(per_process[0], per_process[1]) > 0.05

        # what always holds: the mean over the processes of each one's batch-mean gradient, and the
        # step RAdam takes with it from the previous step's weights and state
        assert_same(took, mean_of_batches, f"step {step}: gradient")
        update = {name: after[name] - before[name] for name in names}
        expected = one.optimiser_step(step - 1, mean_of_batches)
        assert_same(update, {name: expected[name] - before[name] for name in names}, f"step {step}: update")

        if step == 3:   # equal batch sizes: exactly the single-process step on the union of the batches
            assert_same(took, union, "step 3: gradient of the union")
            single = one.optimiser_step(step - 1, union)
            assert_same(update, {name: single[name] - before[name] for name in names}, "step 3: single-process step")
        else:           # one utterance and a padding batch: half the single process's gradient, not all of it
            assert_same(took, {name: union[name] / 2 for name in names}, "step 2: half the union's gradient")
            assert differ(took, union) > 0.4

"""asr.model.diagnostics: attention entropy against hand-made cases, and the CSV a tiny run writes."""
from __future__ import annotations

import csv
import math

import torch

from asr.model.diagnostics import attention_entropy
from asr.training.fit import train
from tiny_runs import tiny_config


def test_identical_keys_give_uniform_attention():
    q = torch.randn(1, 2, 5, 4)
    k = torch.ones(1, 2, 5, 4)                      # every key the same: every logit equal
    assert math.isclose(float(attention_entropy(q, k, torch.tensor([5]), shared_qk=False)), 1.0, rel_tol=1e-5)


def test_one_dominant_key_gives_entropy_near_zero():
    q = torch.zeros(1, 1, 4, 2)
    q[..., 0] = 100.0
    k = torch.zeros(1, 1, 4, 2)
    k[0, 0, 2, 0] = 10.0                            # logit 1000 / sqrt(2) for key 2, 0 for the others
    assert float(attention_entropy(q, k, torch.tensor([4]), shared_qk=False)) < 1e-6


def test_entropy_counts_valid_keys_only_and_skips_padded_queries():
    q = torch.randn(2, 1, 6, 3)
    k = torch.ones(2, 1, 6, 3)
    k[1, :, 3:] = 1e3 * torch.randn(1, 3, 3)        # padded keys of sequence 1: would not be uniform
    lengths = torch.tensor([6, 3])
    assert math.isclose(float(attention_entropy(q, k, lengths, shared_qk=False)), 1.0, rel_tol=1e-5)


def test_shared_qk_entropy_uses_unit_keys_and_no_self():
    """Brute force for one sequence: keys q / |q|, the diagonal masked, entropy over the L - 1 others."""
    q = torch.randn(1, 1, 5, 4)
    keys = q / q.norm(dim=-1, keepdim=True)
    logits = (q @ keys.transpose(-1, -2))[0, 0] / 2.0
    logits.fill_diagonal_(float("-inf"))
    p = logits.softmax(-1)
    entropy = -(p * p.clamp(min=1e-30).log()).sum(-1) / math.log(4)
    expected = float(entropy.mean())
    got = float(attention_entropy(q, q, torch.tensor([5]), shared_qk=True))
    assert math.isclose(got, expected, rel_tol=1e-5)


def test_a_run_with_diagnostics_writes_one_row_per_interval(tiny_synth, tmp_path):
    cfg = tiny_config(tiny_synth, "conf=synth_shared_full", "trainer.diagnostics_every_n_steps=1", "test=false")
    results = train(cfg, tmp_path / "run")
    with open(tmp_path / "run" / "diagnostics.csv", newline="") as handle:
        rows = list(csv.DictReader(handle))
    assert [int(row["step"]) for row in rows] == list(range(results["steps"]))
    for row in rows:
        assert 0.0 <= float(row["entropy/layer0"]) <= 1.0 + 1e-6
        assert float(row["grad_norm/layer0"]) > 0 and float(row["query_norm/layer0"]) > 0
        assert math.isfinite(float(row["loss"]))

"""The masked copy task's mechanics (data, masking, accuracy, a tiny run of the command), not
its finding: that needs minutes of training (attention_ext/RESULTS.md has the measured table)."""
import csv

import pytest
import torch

from attention_ext.benchmarks.copy_task import (SEPARATOR, CopyTask, CopyTransformer, TrainSettings, copy_task_batch,
                                     masked_accuracy, train_copy_task)
from attention_ext.benchmarks.copy_task.__main__ import default_specs, main


@pytest.mark.parametrize("length", [4, 31, 63])
def test_batches_are_0w0w_with_a_fifth_of_the_symbols_masked_in_one_half_only(length):
    task = CopyTask(length)
    inputs, targets, masked = copy_task_batch(task, 64, torch.Generator().manual_seed(length))
    n = 2 * length + 2
    assert inputs.shape == targets.shape == masked.shape == (64, n)
    half = length + 1
    assert torch.all(targets[:, 0] == SEPARATOR) and torch.all(targets[:, half] == SEPARATOR)
    assert torch.equal(targets[:, 1:half], targets[:, half + 1:])                    # w twice
    words = targets[:, 1:half]
    assert words.min() >= 1 and words.max() <= 10
    # 20% of the 2L symbol tokens, never a separator, never the same index in both halves
    assert torch.all(masked.sum(dim=1) == round(0.2 * 2 * length))
    assert not masked[:, 0].any() and not masked[:, half].any()
    assert not (masked[:, 1:half] & masked[:, half + 1:]).any()
    # the input is the target, with the mask token (11) exactly at the masked positions
    assert torch.equal(inputs[~masked], targets[~masked])
    assert task.mask_token == 11 and torch.all(inputs[masked] == 11)
    # every masked token is visible in the other half of the input
    other_half = torch.cat([inputs[:, half:], inputs[:, :half]], dim=1)
    assert torch.equal(other_half[masked], targets[masked])
    # both halves get masked tokens (over a batch), and the symbols are roughly uniform
    assert masked[:, 1:half].any() and masked[:, half + 1:].any()
    assert torch.bincount(words.flatten(), minlength=11)[1:].min() > 0


def test_the_paper_example_of_fig_6_is_a_valid_pair():
    inputs = torch.tensor([[0, 4, 11, 2, 2, 0, 4, 5, 11, 2]])
    targets = torch.tensor([[0, 4, 5, 2, 2, 0, 4, 5, 2, 2]])
    masked = inputs == 11
    other_half = torch.cat([inputs[:, 5:], inputs[:, :5]], dim=1)
    assert torch.equal(other_half[masked], targets[masked])


def test_accuracy_counts_the_masked_tokens_only():
    targets = torch.tensor([[0, 3, 1, 0, 3, 1]])
    masked = torch.tensor([[False, True, False, False, False, True]])
    predicted = torch.tensor([[5, 3, 2, 5, 2, 4]])                   # right at 1, wrong at 5, rest wrong
    logits = torch.nn.functional.one_hot(predicted, 12).float()
    assert masked_accuracy(logits, targets, masked) == 0.5
    assert masked_accuracy(torch.nn.functional.one_hot(targets, 12).float(), targets, masked) == 1.0


def test_an_oracle_that_reads_the_other_half_scores_1_and_a_blind_one_0():
    task = CopyTask(7)
    inputs, targets, masked = copy_task_batch(task, 16, torch.Generator().manual_seed(0))
    half = task.length + 1
    other_half = torch.cat([inputs[:, half:], inputs[:, :half]], dim=1)
    oracle = torch.nn.functional.one_hot(torch.where(masked, other_half, inputs), task.vocabulary).float()
    assert masked_accuracy(oracle, targets, masked) == 1.0
    blind = torch.nn.functional.one_hot(inputs, task.vocabulary).float()   # predicts the mask token
    assert masked_accuracy(blind, targets, masked) == 0.0


@pytest.mark.parametrize("spec", default_specs([2]))
def test_every_default_attention_trains_a_few_steps(spec):
    result = train_copy_task(CopyTask(5), spec, TrainSettings(steps=2, batch=4, width=16, heads=2,
                                                              evaluation_batches=1))
    assert 0.0 <= result.accuracy <= 1.0 and result.loss > 0 and result.train_loss > 0


def test_lsh_gets_a_model_with_shared_query_key_projections():
    model = CopyTransformer(CopyTask(5), "lsh-1", width=16, heads=2)
    assert model.layers[0].key is None
    assert CopyTransformer(CopyTask(5), "full", width=16, heads=2).layers[0].key is not None


def test_the_command_writes_its_table_csv_and_png(tmp_path, capsys):
    out = tmp_path / "out"
    assert main(["--lengths", "3", "--clusters", "2", "--attentions", "full", "i-clustered-2", "--steps", "2",
                 "--batch", "4", "--width", "16", "--heads", "2", "--evaluation-batches", "1", "--jobs", "1",
                 "--no-progress", "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "i-clustered-2" in printed and "accuracy" in printed
    with open(out / "results.csv") as f:
        rows = list(csv.DictReader(f))
    assert [(row["spec"], row["clusters"], row["sequence_length"]) for row in rows] == \
        [("full", "", "8"), ("i-clustered-2", "2", "8")]
    assert (out / "copy_task.png").stat().st_size > 1000


def test_a_spec_that_does_not_fit_the_head_dim_fails_before_training(tmp_path, capsys):
    with pytest.raises(SystemExit):
        main(["--attentions", "agglomerative-16", "--width", "16", "--heads", "2", "--out", str(tmp_path)])
    assert "classes=16 exceeds the head dim 8" in capsys.readouterr().err

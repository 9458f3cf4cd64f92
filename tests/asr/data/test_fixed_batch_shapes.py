"""data.fixed_batch_shapes: every training batch padded to its duration bucket's (rows, frames), and
a padded batch gives the loss and gradients of the unpadded one."""
from __future__ import annotations

import math
import random

import pytest
import torch
from lhotse import CutSet
from lhotse.testing.dummies import dummy_cut

from asr.data.batching.duration_buckets import FixedBatchShapes, duration_bucketing_sampler, pad_to_shape


def test_each_bucket_has_one_shape_that_holds_its_batches():
    shapes = FixedBatchShapes((2.0, 5.0, 9.5), max_duration=20.0, frames_per_second=100.0)
    # rows: floor(20 / bound); frames: bound x 100 rounded up to a multiple of 8
    assert shapes.shapes == [(10, 200), (4, 504), (2, 952)]
    assert shapes.shape_of([1.0, 1.9]) == (10, 200)
    assert shapes.shape_of([1.0, 2.5]) == (4, 504)      # the bucket of the longest utterance
    assert shapes.shape_of([9.5]) == (2, 952)


def test_the_sampler_gives_every_training_batch_its_buckets_shape():
    rng = random.Random(0)
    cuts = CutSet.from_cuts([dummy_cut(i, duration=round(rng.uniform(1.0, 9.0), 2)) for i in range(60)])
    sampler = duration_bucketing_sampler(cuts, max_duration=30.0, num_buckets=3, shuffle=True, seed=0,
                                         fixed_shapes_frames_per_second=100.0)
    allowed = set(sampler.fixed_shapes.shapes)
    assert len(allowed) == 3
    seen, utterances = set(), 0
    for batch in sampler:
        rows, frames = batch.shape
        seen.add(batch.shape)
        utterances += len(batch.cuts)
        assert len(batch.cuts) <= rows
        assert all(math.ceil(cut.duration * 100) <= frames for cut in batch.cuts)
    assert seen == allowed and utterances == 60
    plain = duration_bucketing_sampler(cuts, max_duration=30.0, num_buckets=3, shuffle=True, seed=0)
    assert all(batch.shape is None for batch in plain)


def test_under_ddp_every_rank_sees_only_the_buckets_shapes():
    """Each process captures its own graphs, one per shape it meets: the buckets' shapes only, the
    last round's split pieces and padding batches included. (The ranks of a round usually share a
    bucket, but not where a bucket runs out mid-round.)"""
    rng = random.Random(1)
    cuts = CutSet.from_cuts([dummy_cut(i, duration=round(rng.uniform(1.0, 9.0), 2)) for i in range(41)])
    samplers = [duration_bucketing_sampler(cuts, max_duration=30.0, num_buckets=3, shuffle=True, seed=0,
                                           rank=rank, world_size=3, fixed_shapes_frames_per_second=100.0)
                for rank in range(3)]
    ranks = [list(sampler) for sampler in samplers]
    assert len({len(batches) for batches in ranks}) == 1
    assert any(batch.padding for batches in ranks for batch in batches)
    for batches in ranks:
        assert {batch.shape for batch in batches} <= set(samplers[0].fixed_shapes.shapes)
        assert all(len(batch.cuts) <= batch.shape[0] for batch in batches)


def test_padding_keeps_the_batch_and_adds_one_frame_rows():
    features = torch.randn(2, 5, 3)
    features[1, 4:] = 0
    padded, lengths = pad_to_shape(features, torch.tensor([5, 4]), (4, 8))
    assert padded.shape == (4, 8, 3) and lengths.tolist() == [5, 4, 1, 1]
    assert torch.equal(padded[:2, :5], features) and not padded[:, 5:].any() and not padded[2:].any()


@pytest.mark.parametrize("attention", ["full", "iclustered"])
def test_a_padded_batch_gives_the_loss_and_gradients_of_the_unpadded_one(attention):
    """The attention contract at work: padded keys get no weight and padded query rows are 0, the
    front end zeroes padded frames and the loss leaves out padded rows. (Dropout off: its masks are
    drawn over the whole padded shape. i-clustered with more clusters than frames is exact. The
    gradients agree to float32 rounding: more rows change the order of the sums.)"""
    from attention_ext import validate_attention
    from test_recognizer import UTTERANCES, toy_batch, toy_recognizer

    spec = validate_attention("full") if attention == "full" else validate_attention("iclustered", clusters=100)
    model = toy_recognizer(spec)
    batch = toy_batch(UTTERANCES)
    padded = dict(batch)
    rows, frames = len(batch["ids"]) + 3, batch["features"].shape[1] + 13
    padded["features"], padded["feature_lengths"] = pad_to_shape(batch["features"], batch["feature_lengths"],
                                                                 (rows, frames))

    def loss_and_gradients(b):
        model.zero_grad()
        torch.manual_seed(0)
        total = model._losses(b)[0]
        total.backward()
        return total.detach(), {name: p.grad.clone() for name, p in model.named_parameters()}

    loss, gradients = loss_and_gradients(batch)
    padded_loss, padded_gradients = loss_and_gradients(padded)
    torch.testing.assert_close(padded_loss, loss, rtol=1e-6, atol=1e-6)
    for name, gradient in gradients.items():
        torch.testing.assert_close(padded_gradients[name], gradient, rtol=1e-5, atol=5e-6, msg=name)

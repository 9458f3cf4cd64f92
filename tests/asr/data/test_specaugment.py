import numpy as np
import torch

from asr.data.augment.specaugment import SpecAugment
from asr.data.config import DataConfig
from asr.data.datamodule import SpeechDataModule

FILL = torch.arange(40, dtype=torch.float32) * -1.0 - 100.0  # distinct from every feature value


def masked_cells(original, augmented):
    return (original != augmented).numpy()


def runs(mask_1d):
    """Maximal runs of True as (start, width)."""
    out, start = [], None
    for i, value in enumerate(list(mask_1d) + [False]):
        if value and start is None:
            start = i
        if not value and start is not None:
            out.append((start, i - start))
            start = None
    return out


def batch(lengths, num_bins=40, seed=0):
    features = torch.randn(len(lengths), max(lengths), num_bins, generator=torch.Generator().manual_seed(seed))
    for b, length in enumerate(lengths):
        features[b, length:] = 0.0
    return features, torch.tensor(lengths)


def test_one_frequency_band_per_utterance_of_at_most_the_width_and_only_on_valid_frames():
    augment = SpecAugment(freq_masks=1, freq_mask_width=7, time_masks=0, time_mask_width=0, time_mask_max_fraction=0.0)
    features, lengths = batch([120, 80, 50])
    widths = []
    for seed in range(200):
        out = augment(features, lengths, FILL, torch.Generator().manual_seed(seed))
        mask = masked_cells(features, out)
        for b, length in enumerate(lengths.tolist()):
            assert not mask[b, length:].any()  # padding untouched
            columns = mask[b, :length].all(axis=0)
            assert (mask[b, :length].any(axis=0) == columns).all()  # whole columns over the valid frames
            bands = runs(columns)
            assert len(bands) <= 1
            width = bands[0][1] if bands else 0
            widths.append(width)
            if width:
                start = bands[0][0]
                assert torch.equal(out[b, 0, start:start + width], FILL[start:start + width])
    assert set(widths) == set(range(0, 8))  # widths drawn from 0..7, all of them occur


def test_time_bands_respect_count_width_and_fraction():
    augment = SpecAugment(freq_masks=0, freq_mask_width=0, time_masks=2, time_mask_width=30,
                          time_mask_max_fraction=0.2)
    features, lengths = batch([200, 60])
    longest = [0, 0]
    for seed in range(200):
        out = augment(features, lengths, FILL, torch.Generator().manual_seed(seed))
        mask = masked_cells(features, out)
        for b, length in enumerate(lengths.tolist()):
            rows = mask[b].all(axis=1)
            assert (mask[b].any(axis=1) == rows).all() and not rows[length:].any()
            bands = runs(rows)
            assert len(bands) <= 2  # two masks, possibly overlapping or touching
            limit = min(30, int(0.2 * length))  # 30 for 200 frames, 12 for 60
            assert sum(w for _, w in bands) <= 2 * limit
            if len(bands) == 2:
                assert all(w <= limit for _, w in bands)
                longest[b] = max(longest[b], *(w for _, w in bands))
    assert longest == [30, 12]


def test_masks_counted_per_utterance():
    augment = SpecAugment(freq_masks=3, freq_mask_width=2, time_masks=0, time_mask_width=0, time_mask_max_fraction=0.0)
    features, lengths = batch([100] * 4)
    for seed in range(50):
        out = augment(features, lengths, FILL, torch.Generator().manual_seed(seed))
        for b in range(4):
            columns = masked_cells(features, out)[b].all(axis=0)
            assert len(runs(columns)) <= 3 and columns.sum() <= 6


def test_datamodule_masks_training_batches_only(tiny_corpus):
    cfg = DataConfig(corpus="tiny", root=str(tiny_corpus), targets=["phones"], max_duration=8.0, progress=False,
                     freq_masks=2, freq_mask_width=8, time_masks=2, time_mask_width=20)
    module = SpeechDataModule(cfg)
    module.setup("fit")
    train = module.split("train").features
    dev = module.split("dev").features
    mean = module.feature_mean.numpy()
    masked_frames = 0
    for b in module.train_dataloader():
        for i, cut_id in enumerate(b["ids"]):
            clean = train.store.load(cut_id)
            got = b["features"][i, :len(clean)].numpy()
            changed = got != clean
            assert np.allclose(got[changed], np.broadcast_to(mean, got.shape)[changed])  # masked with the mean
            masked_frames += changed.any(axis=1).sum()
    assert masked_frames > 0
    for b in module.val_dataloader():
        for i, cut_id in enumerate(b["ids"]):
            clean = dev.store.load(cut_id)
            assert np.array_equal(b["features"][i, :len(clean)].numpy(), clean)
            assert not b["features"][i, len(clean):].any()


def test_training_masks_repeat_for_seed_and_epoch_whatever_the_workers(tiny_corpus):
    """A resumed run (a fresh data module, set to the epoch) and a run with a worker draw the same masks."""
    def epoch_batches(epoch, num_workers):
        module = SpeechDataModule(DataConfig(corpus="tiny", root=str(tiny_corpus), targets=["phones"],
                                             max_duration=8.0, progress=False, num_workers=num_workers), seed=7)
        module.setup("fit")
        loader = module.train_dataloader()
        loader.sampler.set_epoch(epoch)
        return {tuple(b["ids"]): b["features"] for b in loader}

    first = epoch_batches(1, 0)
    for again in (epoch_batches(1, 0), epoch_batches(1, 1)):
        assert again.keys() == first.keys()
        assert all(torch.equal(again[ids], first[ids]) for ids in first)
    # the same utterances in another epoch get other masks: compare each utterance's features
    def by_cut(batches):
        return {cut_id: features[i] for ids, features in batches.items() for i, cut_id in enumerate(ids)}
    one, two = by_cut(first), by_cut(epoch_batches(2, 0))
    differing = sum(not torch.equal(one[c][:min(len(one[c]), len(two[c]))], two[c][:min(len(one[c]), len(two[c]))])
                    for c in one)
    assert differing > len(one) // 2

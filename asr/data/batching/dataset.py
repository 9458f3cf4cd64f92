"""From a batch of cuts (chosen by the sampler) to a padded batch of tensors: a `Batch`."""

from __future__ import annotations

import hashlib
import logging
from typing import TypedDict

import torch

from lhotse import CutSet

from asr.data.augment.specaugment import SpecAugment
from asr.data.batching.duration_buckets import EpochBatch, pad_to_shape
from asr.data.splits.cut_checks import ctc_min_frames
from asr.data.features.feature_cache import OnTheFlyFeatures, StoredFeatures, single_torch_thread
from asr.data.batching.joined_examples import Pause, join_rows, utterances_of
from asr.data.corpus.manifests import listing, transcript
from asr.data.streaming.stream_shards import StreamedFeatures
from asr.data.splits.tokenizers import Tokenizer, encode_transcripts
from asr.data.augment.vtlp import VocalTractLengthPerturbation
from asr.data.augment.waveform_augmentation import WaveformAugmenter

log = logging.getLogger(__name__)


class Batch(TypedDict):
    """What the data loaders yield (a dict, so Lightning moves it between devices as it is)."""
    features: torch.Tensor                  # (B, T, F) float32 log-mel fbank, NOT normalised, 0 past each length
    feature_lengths: torch.Tensor           # (B,) int64
    # With data.fixed_batch_shapes, features and feature_lengths have more rows than the batch has
    # utterances (len(ids)): the rows past them are padding (asr.data.batching.duration_buckets.FixedBatchShapes).
    targets: dict[str, torch.Tensor]        # {kind: (B, S) int64}, padded with 0 (the blank)
    target_lengths: dict[str, torch.Tensor]  # {kind: (B,) int64}
    ids: list[str]                          # cut ids
    texts: list[str]                        # normalised words
    phones: list[str]                       # space-separated phones
    # A stand-in batch of a DDP rank with nothing left to do in an epoch's last round
    # (asr.data.batching.duration_buckets): the model runs it but neither counts nor learns from it.
    padding: bool


# The batch field holding the reference strings of each tokenizer field (Tokenizer.field).
REFERENCE_FIELD = {"phones": "phones", "text": "texts"}


def batch_references(batch: Batch, fields: dict[str, str]) -> dict[str, list[str]]:
    """{kind: the batch's reference strings} for `fields` {kind: its tokenizer's field}."""
    return {kind: batch[REFERENCE_FIELD[field]] for kind, field in fields.items()}


def pad_sequences(sequences: list[torch.Tensor], padding_value: float = 0.0) -> torch.Tensor:
    return torch.nn.utils.rnn.pad_sequence(sequences, batch_first=True, padding_value=padding_value)


class SpeechBatchDataset(torch.utils.data.Dataset):
    """A map-style dataset whose index is a CutSet (what lhotse samplers yield); returns a Batch.

    `tokenizers`: {kind: tokenizer}; a batch's transcripts are encoded when it is built (every
    transcript was checked once when the split was loaded: `tokenizers.check_transcripts`).
    `augmenter` (training only) transforms the audio of the utterances it draws a transform for
    (their features are then computed from it; asr.data.augment.waveform_augmentation), seeded per
    utterance from (seed, epoch, cut id); `vtlp` (training only) then warps the frequency axis of
    the utterances it draws a warp for, seeded the same way. `specaugment` (training only) masks with `fill` (the
    global feature mean). Its random draws are seeded from (seed, epoch, the batch's cut ids), so a run is repeatable - with any number of
    workers, and after resuming from a checkpoint - and every epoch draws fresh masks.

    The index is an `EpochBatch` (what `asr.data.batching.duration_buckets`'s and `asr.data.batching.stream_sampler`'s samplers
    yield) or a plain CutSet/list of cuts (taken as epoch 0); a streamed split's cuts are StreamCuts.

    `ctc_frame_subsampling` (a streamed training split): utterances whose targets need more encoder
    frames than they have are left out of their batch and logged - what the eager path does once per
    split (asr.data.splits.cut_checks.drop_ctc_infeasible); a batch left empty becomes a padding batch.

    Joined training examples (MixedCuts, asr.data.batching.joined_examples; `pause` says what goes between
    their utterances): every augmentation applies to each utterance as it would alone - its waveform
    transforms, its VTLP warp, its SpecAugment masks (drawn from the batch's utterance ids, so the
    density of masks per second stays what it is for single utterances); the utterances are then
    joined with the pause frames between them, which no augmentation touches.
    """

    def __init__(self, tokenizers: dict[str, Tokenizer], features: StoredFeatures | OnTheFlyFeatures | StreamedFeatures,
                 specaugment: SpecAugment | None = None, fill: torch.Tensor | None = None, seed: int = 0,
                 augmenter: WaveformAugmenter | None = None, vtlp: VocalTractLengthPerturbation | None = None,
                 ctc_frame_subsampling: int | None = None, pause: Pause | None = None):
        if specaugment is not None and fill is None:
            raise ValueError("SpecAugment needs the fill value (the global feature mean)")
        self.tokenizers = tokenizers
        self.features = features
        self.specaugment = specaugment
        self.fill = fill
        self.seed = seed
        self.augmenter = augmenter
        self.vtlp = vtlp   # training only: warps the features' frequency axis per utterance (asr/data/augment/vtlp.py)
        self.ctc_frame_subsampling = ctc_frame_subsampling
        self.pause = pause   # between the utterances of a joined example

    def __getitem__(self, item: EpochBatch | CutSet | list) -> Batch:
        epoch, cuts, padding, shape = (item.epoch, item.cuts, item.padding, item.shape) \
            if isinstance(item, EpochBatch) else (0, item, False, None)
        # Batch building is many small tensor ops: intra-op threads only add overhead (15x slower measured
        # with num_workers=0 on a busy 2-core machine), so it runs on one thread, restored afterwards.
        cuts = list(cuts)
        if self.ctc_frame_subsampling is not None and not padding:
            feasible = [cut for cut in cuts if self._ctc_feasible(cut)]
            if not feasible:   # nothing left to learn from: the step is still taken (DDP), as a padding batch
                padding = True
            else:
                cuts = feasible
        with single_torch_thread():
            batch = self._build(cuts, epoch)
            if shape is not None:   # its bucket's fixed shape (data.fixed_batch_shapes), after SpecAugment's draws
                batch["features"], batch["feature_lengths"] = pad_to_shape(batch["features"], batch["feature_lengths"],
                                                                           shape)
            return Batch(**batch, padding=padding)

    def _ctc_feasible(self, cut) -> bool:
        frames = self.features.num_frames(cut) // self.ctc_frame_subsampling
        too_many = [kind for kind, ids in encode_transcripts(cut, self.tokenizers).items() if ctc_min_frames(ids) > frames]
        if too_many:
            log.warning("leaving out %s: more %s targets than its %d encoder frames", cut.id, listing(too_many), frames)
        return not too_many

    def _build(self, cuts: list, epoch: int) -> dict:
        # a joined example's utterances are augmented one by one, then joined (the class doc)
        rows = [utterances_of(cut) for cut in cuts]
        utterances = [utterance for row in rows for utterance in row]
        if self.augmenter is None:
            features = [self.features.load(cut) for cut in utterances]
        else:
            features = [self.augmenter.features(cut, epoch, self.features) for cut in utterances]
        feature_lengths = torch.tensor([len(f) for f in features], dtype=torch.int64)
        padded = pad_sequences(features)
        utterance_ids = [cut.id for cut in utterances]
        if self.vtlp is not None:
            padded = self.vtlp(padded, feature_lengths, utterance_ids, epoch)
        if self.specaugment is not None:
            key = f"{self.seed}:{epoch}:{','.join(utterance_ids)}".encode()
            generator = torch.Generator().manual_seed(int(hashlib.sha1(key).hexdigest()[:15], 16))
            padded = self.specaugment(padded, feature_lengths, self.fill, generator)
        if len(rows) != len(utterances):
            if self.pause is None:
                raise ValueError("joined examples need the pause between their utterances (SpeechBatchDataset's pause)")
            padded, feature_lengths = join_rows(padded, feature_lengths, [len(row) for row in rows], self.pause)
        ids = [cut.id for cut in cuts]
        encoded = [encode_transcripts(cut, self.tokenizers) for cut in cuts]
        targets, target_lengths = {}, {}
        for kind in (self.tokenizers if cuts else ()):
            sequences = [torch.tensor(ids[kind], dtype=torch.int64) for ids in encoded]
            targets[kind] = pad_sequences(sequences, 0).to(torch.int64)
            target_lengths[kind] = torch.tensor([len(s) for s in sequences], dtype=torch.int64)
        return {
            "features": padded,
            "feature_lengths": feature_lengths,
            "targets": targets,
            "target_lengths": target_lengths,
            "ids": ids,
            "texts": [transcript(cut, "text") for cut in cuts],
            "phones": [transcript(cut, "phones") for cut in cuts],
        }


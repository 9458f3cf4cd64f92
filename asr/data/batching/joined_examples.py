"""Long training examples: consecutive training utterances joined, with a pause between them, into
examples of up to `data.join_seconds` (asr/docs/data.md, "Long training examples").

Grouping (`join_utterances`), once per run, on the training split only:
- the utterances are taken in manifest order; with `data.join_by=speaker` those of one speaker
  (the supervision's `speaker`; utterances without one form one group of their own) are joined with
  each other, in their manifest order, with `none` simply consecutive ones. Speed-perturbed copies
  (`data.augment.speed`) join copies of the same factor only.
- each example's length is drawn uniformly between half and all of `join_seconds` (a stream seeded
  by the run's seed), and utterances are added while the example stays within it, so the model trains
  on a spread of long lengths, not one; an utterance longer than its draw is an example alone. Every
  utterance is in exactly one example.
- the examples are fixed for the run: the sampler shuffles and buckets them by duration each epoch
  as it does utterances (asr.data.batching.duration_buckets), so epochs, DDP shares and resumed runs stay what they
  are for utterances; what varies per epoch inside an example is each utterance's augmentation.

An example is a lhotse MixedCut whose tracks are its utterances at their offsets (the pause left as
a gap; `MixedCut.load_audio` would give the same recording with digital silence in the pauses).

Features (`join_rows`): the utterances' own features (cached, or computed from their augmented audio)
in order, with `pause_frames` copies of `pause_vector` between two of them. The pause is the filter
bank's output for digital silence (Kaldi's log energy floor in every bin): what a pause of zero
samples inside a recording gives away from its edges (so what a long recording of utterances joined
with silent pauses holds between them), and what the synthetic voices' own trailing silences are. (Real recordings pause
on their noise floor instead; their utterances' own quiet frames would be the closer pause there.)

Targets (`asr.data.corpus.manifests.transcript` of a MixedCut): the utterances' transcripts joined with a
space, then encoded as any transcript: phone ids concatenated, characters with the space id
between utterances, sentencepiece with the word-start piece of the next utterance's first word.
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass

import numpy as np
import torch
from lhotse.cut import MixedCut
from lhotse.cut.mixed import MixTrack

from asr.data.features.features import FilterBank

JOIN_BY = ("speaker", "none")


@dataclass(frozen=True)
class Pause:
    """What goes between two joined utterances: `frames` copies of `vector` (F,)."""

    frames: int
    vector: torch.Tensor
    frames_per_second: float        # of the features (100 for a 10 ms shift)

    @property
    def seconds(self) -> float:
        """The pause's length in seconds: whole frames, so an example's duration and frames agree."""
        return self.frames / self.frames_per_second


def pause_between(filterbank: FilterBank, seconds: float) -> Pause:
    """The pause of `seconds` (rounded to whole frames) in the features of `filterbank`: the filter
    bank of one frame of digital silence, repeated."""
    frames_per_second = 1000.0 / filterbank.frame_shift_ms
    vector = filterbank(np.zeros(filterbank.frame_length, dtype=np.float32))[0]
    return Pause(int(round(seconds * frames_per_second)), vector, frames_per_second)


def utterances_of(cut) -> list:
    """The utterances an example is made of: a joined example's, in order, or the cut itself."""
    if isinstance(cut, MixedCut):
        return [track.cut for track in cut.tracks]
    return [cut]


def _group_key(cut, join_by: str) -> tuple:
    # speed-perturbed copies carry their resampling in the recording's transforms
    transforms = getattr(cut.recording, "transforms", None) or []
    speed = json.dumps([t if isinstance(t, dict) else t.to_dict() for t in transforms], sort_keys=True)
    speaker = cut.supervisions[0].speaker if join_by == "speaker" and cut.supervisions else None
    return speaker, speed


def join_utterances(cuts, join_seconds: float, pause: Pause, join_by: str, seed: int) -> list:
    """The training examples (module doc): MixedCuts of consecutive utterances of `cuts`, each at
    most its drawn length in [join_seconds / 2, join_seconds]; an utterance left alone is itself."""
    if join_by not in JOIN_BY:
        raise ValueError(f"data.join_by={join_by!r}; choose one of {', '.join(JOIN_BY)}")
    groups: dict[tuple, list] = {}
    for cut in cuts:   # dicts keep insertion order: groups in order of first appearance, cuts in manifest order
        groups.setdefault(_group_key(cut, join_by), []).append(cut)
    pause_seconds = pause.seconds
    draws = random.Random(f"join:{seed}")
    examples: list[MixedCut] = []

    def close(members: list) -> None:
        if len(members) == 1:   # an utterance alone stays what it is
            examples.append(members[0])
            return
        offset, tracks = 0.0, []
        for member in members:
            tracks.append(MixTrack(cut=member, offset=round(offset, 8)))
            offset += member.duration + pause_seconds
        examples.append(MixedCut(id="+".join(m.id for m in members), tracks=tracks))

    for members in groups.values():
        current, length, target = [], 0.0, draws.uniform(join_seconds / 2, join_seconds)
        for cut in members:
            added = cut.duration + (pause_seconds if current else 0.0)
            if current and length + added > target:
                close(current)
                current, length, target = [], 0.0, draws.uniform(join_seconds / 2, join_seconds)
                added = cut.duration
            current.append(cut)
            length += added
        if current:
            close(current)
    return examples


def join_rows(features: torch.Tensor, lengths: torch.Tensor, row_sizes: list[int], pause: Pause
              ) -> tuple[torch.Tensor, torch.Tensor]:
    """(U, T, F) padded utterance features and their (U,) lengths -> (B, T', F) examples and (B,)
    lengths: example b is the next `row_sizes[b]` utterances' valid frames in order, with the pause
    between two of them; 0 past each length."""
    if sum(row_sizes) != len(lengths):
        raise ValueError(f"row sizes {row_sizes} do not add up to the {len(lengths)} utterances")
    gap = pause.vector.to(features.dtype).expand(pause.frames, -1)
    rows, start = [], 0
    for size in row_sizes:
        pieces = []
        for i in range(start, start + size):
            if i > start and pause.frames:
                pieces.append(gap)
            pieces.append(features[i, :int(lengths[i])])
        rows.append(torch.cat(pieces))
        start += size
    joined_lengths = torch.tensor([len(row) for row in rows], dtype=torch.int64)
    return torch.nn.utils.rnn.pad_sequence(rows, batch_first=True), joined_lengths

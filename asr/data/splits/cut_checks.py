"""The per-utterance checks of a split: the one place that decides whether an utterance can be used
at all, and that leaves out (and counts, in `SplitData.dropped`) those that cannot.

`drop_unusable_cuts` runs once when the split is loaded, before any feature is computed;
`drop_bad_audio` again for audio found corrupt when the features are computed; `drop_ctc_infeasible`
once the features say how many frames each utterance has.

Found here, recorded under the reason "bad_audio" (so `data.skip_bad_audio` decides: false, one
error at start-up listing every such utterance; true, they are left out and counted):
- the audio file is missing or unreadable (an empty file, not audio), has another sampling rate or
  fewer samples than the manifest says, or more channels than the recording (a stereo file where the
  manifest expects mono): `find_bad_audio`, which reads file headers only;
- the recording is not at the features' sampling rate (16 kHz): resample it in the recipe;
- the utterance is too short for one feature frame (a 0-second cut);
- the utterance is longer than data.max_duration: no batch can hold it.
A file corrupt past its header (a truncated FLAC) is found when its features are computed, under the
same reason and policy: with precomputed features (the default) that is every file, before training;
with `data.precompute_features=false` only the files of the statistics' sample
(`feature_stats.statistics_sample`, every file of a split up to 5,000 utterances) are decoded before
training, and a larger split's other files are decoded first when their batch is built - decoding
every file of 1,000 h at start-up would take over an hour, the cost that mode exists to avoid.
Empty transcripts (words, or phones when phones are a target) are left out and counted under
"empty_transcript". Transcripts with a symbol outside a tokenizer's table fail in
`tokenizers.check_transcripts`, naming every symbol.

CTC feasibility (`note_ctc_candidate` when the targets are checked, `drop_ctc_infeasible` once the
features are attached): a training utterance whose targets need more frames than the
encoder gives (T // frame_subsampling, with a blank between repeated tokens) is left out and counted
under "too_many_targets"; in dev/test such utterances are kept (error rates must cover the whole set)
and counted - their CTC loss is infinite, so the loss uses `zero_infinity=True`.

A duplicated utterance id is a ManifestError at once, whatever the policy: the features, the targets
and the scores are keyed by id, so two utterances with one id would silently become one.
"""
from __future__ import annotations

import logging
from collections import Counter, defaultdict
from dataclasses import dataclass, field

import numpy as np
from lhotse import CutSet

from asr.data.audio.audio_source import not_a_regular_file
from asr.data.features.feature_cache import OnTheFlyFeatures, StoredFeatures
from asr.data.features.features import SAMPLING_RATE, FilterBank
from asr.data.corpus.manifests import ManifestError, listing, transcript

log = logging.getLogger(__name__)


class UtteranceProblems:
    """Cuts with a per-utterance problem, by reason: {reason: {cut_id: detail}}."""

    def __init__(self):
        self.by_reason: dict[str, dict[str, str]] = defaultdict(dict)

    def add(self, reason: str, cut_id: str, detail: str = "") -> None:
        self.by_reason[reason][cut_id] = detail

    def cut_ids(self, reason: str | None = None) -> set[str]:
        if reason is not None:
            return set(self.by_reason.get(reason, {}))
        return {cut_id for cuts in self.by_reason.values() for cut_id in cuts}

    def counts(self) -> dict[str, int]:
        return {reason: len(cuts) for reason, cuts in self.by_reason.items() if cuts}

    def describe(self, reason: str) -> str:
        entries = self.by_reason.get(reason, {})
        return listing(f"{cut_id} ({detail})" if detail else cut_id for cut_id, detail in entries.items())


@dataclass
class SplitData:
    """One split on its way to batches: the cuts kept so far, their token ids, where their features
    come from (each filled in by its step), and what was left out."""

    name: str
    cuts: CutSet
    # the cuts CTC may not align once their frames are known: cut_id -> (cut, {kind: CTC's fewest frames})
    ctc_candidates: dict[str, tuple] = field(default_factory=dict)
    features: StoredFeatures | OnTheFlyFeatures | None = None
    dropped: dict[str, int] = field(default_factory=dict)   # reason -> count
    ctc_infeasible_kept: int = 0

    @property
    def hours(self) -> float:
        return sum(cut.duration for cut in self.cuts) / 3600.0

    @property
    def utterances(self) -> int:
        return len(self.cuts)

    def drop(self, cut_ids: set[str], reason: str) -> None:
        """Leave `cut_ids` out, counted under `reason`; ManifestError if no utterance is left."""
        if not cut_ids:
            return
        self.cuts = self.cuts.filter(lambda cut: cut.id not in cut_ids).to_eager()
        for cut_id in cut_ids:
            self.ctc_candidates.pop(cut_id, None)
        self.dropped[reason] = self.dropped.get(reason, 0) + len(cut_ids)
        if len(self.cuts) == 0:
            raise ManifestError(f"split {self.name!r} has no utterances left after dropping {len(cut_ids)} "
                                f"for {reason.replace('_', ' ')} (see the messages above)")


def drop_unusable_cuts(split: str, cuts: CutSet, need_phones: bool, max_duration: float, filterbank: FilterBank,
                       skip_bad_audio: bool) -> SplitData:
    """The split with the cuts that can be used: bad audio (`find_unusable_cuts`) fails or is left
    out as `skip_bad_audio` says (`drop_bad_audio`); empty transcripts are left out, counted and logged."""
    problems = UtteranceProblems()
    find_empty_transcripts(cuts, {"text"} | ({"phones"} if need_phones else set()), problems)
    find_unusable_cuts(cuts, split, problems, max_duration, filterbank)
    data = SplitData(split, cuts)
    drop_bad_audio(data, problems.by_reason.get("bad_audio", {}), skip_bad_audio)
    empty = problems.cut_ids("empty_transcript")
    if empty:
        log.warning("%s: skipping %d utterances with an empty transcript: %s", split, len(empty),
                    problems.describe("empty_transcript"))
        data.drop(empty, "empty_transcript")
    return data


def drop_bad_audio(data: SplitData, failures: dict[str, str], skip_bad_audio: bool) -> None:
    """`failures` {cut_id: what is wrong with its audio}: one ManifestError listing them all, or, with
    `skip_bad_audio`, left out and counted under "bad_audio"."""
    if not failures:
        return
    described = listing(f"{cut_id}: {message}" for cut_id, message in failures.items())
    if not skip_bad_audio:
        raise ManifestError(
            f"{data.name}: {len(failures)} utterances have missing, unreadable or unusable audio: {described}. "
            "Regenerate or fix these files (for synth: rerun recipes.synth.prepare, which redoes what is "
            "missing), or set data.skip_bad_audio=true to leave them out. Features computed so far are kept.")
    log.warning("%s: skipping %d utterances with missing, unreadable or unusable audio (data.skip_bad_audio=true): %s",
                data.name, len(failures), described)
    data.drop(set(failures), "bad_audio")


def find_empty_transcripts(cuts: CutSet, fields: set[str], problems: UtteranceProblems) -> None:
    """Record cuts whose text or phones (those in `fields`) are empty or whitespace."""
    for cut in cuts:
        empty = [field for field in sorted(fields) if not transcript(cut, field).strip()]
        if empty:
            problems.add("empty_transcript", cut.id, "empty " + " and ".join(empty))


def find_bad_audio(cuts: CutSet, problems: UtteranceProblems) -> None:
    """Record cuts whose audio file is missing, unreadable, or shorter than the cut says.

    Reads only file headers (fast); a file that is corrupt past its header is caught when its
    features are computed and is reported under the same reason.
    """
    import soundfile

    checked: dict[str, str] = {}  # path -> "" if fine, else the problem
    for cut in cuts:
        recording = cut.recording
        for source in recording.sources:
            if source.type != "file":
                continue  # URLs, commands: checked when loaded
            path = source.source
            if path not in checked:
                checked[path] = _audio_file_problem(path, recording, soundfile)
            if checked[path]:
                problems.add("bad_audio", cut.id, f"{path}: {checked[path]}")


def _audio_file_problem(path: str, recording, soundfile) -> str:
    problem = not_a_regular_file(path)
    if problem:
        return problem
    try:
        info = soundfile.info(path)
    except Exception as error:  # soundfile.LibsndfileError, RuntimeError, ...
        return f"unreadable audio ({error})"
    if info.samplerate != recording.sampling_rate:
        return f"file is {info.samplerate} Hz, manifest says {recording.sampling_rate} Hz"
    if info.channels > len(recording.channel_ids):
        return (f"file has {info.channels} channels, manifest says {len(recording.channel_ids)} "
                "(a stereo file where mono is expected?)")
    if info.frames < recording.num_samples:
        return f"file has {info.frames} samples, manifest says {recording.num_samples} (truncated?)"
    return ""


def find_unusable_cuts(cuts: CutSet, split: str, problems: UtteranceProblems, max_duration: float,
                       filterbank: FilterBank) -> None:
    """Records in `problems` every cut of `split` that cannot be used (see the module doc);
    ManifestError for duplicated ids."""
    counts = Counter(cut.id for cut in cuts)
    repeated = [f"{cut_id} ({n} times)" for cut_id, n in counts.items() if n > 1]
    if repeated:
        raise ManifestError(f"{split}: {len(repeated)} utterance ids appear more than once in the manifest: "
                            f"{listing(repeated)}; every utterance needs its own id (remove the copies or rename "
                            "them in the recipe's output)")
    find_bad_audio(cuts, problems)
    for cut in cuts:
        if cut.id in problems.by_reason.get("bad_audio", {}):
            continue   # its file is the problem; one reason per cut
        if cut.sampling_rate != SAMPLING_RATE:
            problems.add("bad_audio", cut.id, f"recorded at {cut.sampling_rate} Hz; the features need "
                                              f"{SAMPLING_RATE} Hz (resample it, e.g. `sox in.wav -r {SAMPLING_RATE} "
                                              "out.wav`)")
        elif filterbank.num_frames(cut.num_samples) == 0:
            problems.add("bad_audio", cut.id, f"{cut.duration:.3f} s, too short for one "
                                              f"{filterbank.frame_length_ms:g} ms feature frame")
        elif cut.duration > max_duration:
            problems.add("bad_audio", cut.id, f"{cut.duration:.1f} s, longer than data.max_duration={max_duration:g} s "
                                              f"(no batch can hold it; data.max_duration={cut.duration + 0.1:.1f} "
                                              "would keep it)")


def ctc_min_frames(ids: list[int]) -> int:
    """The fewest output frames CTC needs for the target `ids`: one per token, plus one blank
    between each pair of equal neighbours (a CTC path cannot emit 'a a' without a blank between)."""
    return len(ids) + int(np.count_nonzero(np.diff(np.asarray(ids)) == 0)) if ids else 0


def note_ctc_candidate(data: SplitData, cut, ids: dict[str, list[int]], filterbank: FilterBank,
                       frame_subsampling: int) -> None:
    """Keep `cut` for `drop_ctc_infeasible` if its targets `ids` may need more encoder frames than
    its audio gives. The frames are estimated from the manifest's sample count - what the features
    have, one frame of margin kept - so only these few cuts, not every cut's ids, wait in memory
    until the features are attached."""
    needed = {kind: ctc_min_frames(kind_ids) for kind, kind_ids in ids.items()}
    if max(needed.values(), default=0) >= filterbank.num_frames(cut.num_samples) // frame_subsampling:
        data.ctc_candidates[cut.id] = (cut, needed)


def drop_ctc_infeasible(data: SplitData, frame_subsampling: int, is_train: bool) -> None:
    """Utterances with more CTC targets than encoder frames (module doc): left out of a training
    split, counted and kept in any other; logged either way. Checks the candidates
    `note_ctc_candidate` kept, against the frames their features have."""
    infeasible, by_kind = set(), defaultdict(int)
    for cut_id, (cut, needed) in data.ctc_candidates.items():
        frames = data.features.num_frames(cut) // frame_subsampling
        for kind, fewest in needed.items():
            if fewest > frames:
                infeasible.add(cut_id)
                by_kind[kind] += 1
    data.ctc_candidates = {}
    if not infeasible:
        return
    detail = (f"(frame_subsampling={frame_subsampling}; by target: "
              f"{', '.join(f'{kind} {n}' for kind, n in by_kind.items())})")
    if len(infeasible) > 0.1 * len(data.cuts):
        detail += ("; that is many: the encoder's subsampling leaves too few frames for these targets, "
                   "consider a smaller model subsampling or other data.targets")
    if is_train:
        log.warning("%s: dropping %d of %d utterances with more CTC targets than encoder frames %s: %s", data.name,
                    len(infeasible), len(data.cuts), detail, listing(sorted(infeasible)))
        data.drop(infeasible, "too_many_targets")
    else:
        data.ctc_infeasible_kept = len(infeasible)
        log.warning("%s: %d of %d utterances have more CTC targets than encoder frames %s; kept for the "
                    "error rates, their CTC loss is infinite (use zero_infinity): %s", data.name, len(infeasible),
                    len(data.cuts), detail, listing(sorted(infeasible)))

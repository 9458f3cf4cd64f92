"""The per-utterance checks of a split, run once when the split is loaded, before any feature is
computed: the one place that decides whether an utterance can be used at all.

Found here, recorded under the reason "bad_audio" (so `data.skip_bad_audio` decides: false, one
error at start-up listing every such utterance; true, they are left out and counted):
- the audio file is missing or unreadable (an empty file, not audio), has another sampling rate or
  fewer samples than the manifest says, or more channels than the recording (a stereo file where the
  manifest expects mono): `manifests.find_bad_audio`, which reads file headers only;
- the recording is not at the features' sampling rate (16 kHz): resample it in the recipe;
- the utterance is too short for one feature frame (a 0-second cut);
- the utterance is longer than data.max_duration: no batch can hold it.
A file corrupt past its header (a truncated FLAC) is found when its features are computed, under the
same reason and policy. Transcripts with a symbol outside a tokenizer's table fail in
`SpeechDataModule._encode`, naming every symbol.

A duplicated utterance id is a ManifestError at once, whatever the policy: the features, the targets
and the scores are keyed by id, so two utterances with one id would silently become one.
"""
from __future__ import annotations

from collections import Counter

from lhotse import CutSet

from asr.data.features import SAMPLING_RATE, FilterBank
from asr.data.manifests import ManifestError, UtteranceProblems, find_bad_audio, listing


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

"""A tiny corpus on disk in the manifest format the recipes write (recipes/README.md, "The other corpora")."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import soundfile
from lhotse import CutSet, MonoCut, Recording, RecordingSet, SupervisionSegment, SupervisionSet

from asr.text.phones import ARPABET_39

SAMPLING_RATE = 16000
WORDS = ["the", "cat", "sat", "on", "a", "mat", "don't", "quick", "zebra", "jumps", "over", "lazy", "dog"]


def synthetic_speech(duration: float, rng: np.random.Generator) -> np.ndarray:
    """A few gliding harmonics with an amplitude envelope, plus noise: speech-like spectra, not silence."""
    t = np.arange(int(round(duration * SAMPLING_RATE))) / SAMPLING_RATE
    f0 = rng.uniform(90, 220) * (1 + 0.2 * np.sin(2 * np.pi * rng.uniform(0.5, 3) * t))
    phase = 2 * np.pi * np.cumsum(f0) / SAMPLING_RATE
    voiced = sum(np.sin(k * phase) / k for k in range(1, 8))
    envelope = 0.5 + 0.5 * np.sin(2 * np.pi * rng.uniform(2, 5) * t) ** 2
    audio = 0.15 * envelope * voiced + 0.01 * rng.standard_normal(t.size)
    return np.clip(audio, -0.99, 0.99).astype(np.float32)


def make_utterances(n: int, seed: int, prefix: str, min_duration: float = 0.6, max_duration: float = 2.5):
    rng = np.random.default_rng(seed)
    utterances = []
    for i in range(n):
        words = " ".join(rng.choice(WORDS, size=rng.integers(1, 5)))
        phones = " ".join(rng.choice(ARPABET_39, size=rng.integers(3, 12)))
        utterances.append({"id": f"{prefix}{i:04d}", "duration": float(rng.uniform(min_duration, max_duration)),
                           "text": words, "phones": phones})
    return utterances


def write_corpus(root: Path, splits: dict[str, list[dict]], corpus: str = "tiny", relative_paths: bool = False,
                 seed: int = 0) -> Path:
    """Write FLAC audio and {corpus}_{recordings,supervisions,cuts}_{split}.jsonl.gz under root.

    Each utterance dict: id, duration (s), text, phones; optional "audio" (a float array to use as is),
    "phone_set" (written to custom["phone_set"] as recipes do).
    """
    root = Path(root)
    (root / "audio").mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    for split, utterances in splits.items():
        recordings, supervisions, cuts = [], [], []
        for u in utterances:
            audio = u.get("audio")
            if audio is None:
                audio = synthetic_speech(u["duration"], rng)
            path = root / "audio" / f"{u['id']}.flac"
            soundfile.write(path, audio, SAMPLING_RATE, subtype="PCM_16")
            recording = Recording.from_file(path, recording_id=u["id"])
            if relative_paths:
                recording.sources[0].source = str(path.relative_to(root))
            supervision = SupervisionSegment(id=u["id"], recording_id=u["id"], start=0.0,
                                             duration=recording.duration, channel=0, text=u["text"],
                                             speaker=u.get("speaker", "spk0"),
                                             custom={"phones": u["phones"], **({"phone_set": u["phone_set"]}
                                                                               if "phone_set" in u else {})})
            recordings.append(recording)
            supervisions.append(supervision)
            cuts.append(MonoCut(id=u["id"], start=0.0, duration=recording.duration, channel=0,
                                recording=recording, supervisions=[supervision]))
        RecordingSet.from_recordings(recordings).to_file(root / f"{corpus}_recordings_{split}.jsonl.gz")
        SupervisionSet.from_segments(supervisions).to_file(root / f"{corpus}_supervisions_{split}.jsonl.gz")
        CutSet.from_cuts(cuts).to_file(root / f"{corpus}_cuts_{split}.jsonl.gz")
    return root

"""Speakers made from few voices: formant and pitch shifts of a training utterance (`data.augment.speaker_*`).

The synthetic corpus has a handful of voice engines; real speakers differ from them (and from each
other) mostly in vocal tract length, which scales the formants, and in pitch. With probability
`speaker_prob` an utterance is given to another speaker with Praat's "Change gender" (through
praat-parselmouth; Praat's manual, "Sound: Change gender..."):

    formant ratio r      ~ log-uniform in `speaker_formant_range`   every formant times r (the vocal tract
                                                                    1/r as long); Praat resamples by r, then
                                                                    restores pitch and duration by PSOLA
    pitch factor p       ~ log-uniform in `speaker_pitch_range`     the new median F0 = p x the utterance's
                                                                    median F0 (kept within 70-350 Hz)
    intonation factor i  ~ log-uniform in `speaker_intonation_range`  F0's excursions around the median times i
                                                                    (Praat's "pitch range factor")
    duration factor 1    the timing (and so the transcript's alignment and the CTC frame count) is kept

Decisions:
- The three factors are drawn independently: among adults F0 and vocal tract length are only
  loosely related, and a pairing the voice engines never made is what adds speakers.
- The median F0 comes from Praat's autocorrelation pitch tracker (75-600 Hz, Change gender's own
  defaults) and the same Pitch object is handed to Change gender ("Sound & Pitch: Change gender"),
  so the pitch is tracked once, not twice. The new median is kept within 70-350 Hz
  (adult to child speech), so a high voice raised further stays a voice.
- An utterance without voiced frames (whisper, noise) gets the formant shift only (Praat's new
  pitch median 0: keep the pitch); one too short for the tracker (3 periods of 75 Hz, 40 ms) is
  left as it is.
- The output keeps the input's sample count exactly (cut, or padded with zeros, should Praat's
  differ; it matched on every utterance tried).
- r < 1 leaves the band above r x Nyquist nearly empty (nothing above Nyquist to move down), as a
  band limit of the channel transform does.
- Praat's overlap-add draws random numbers (the same call gives another waveform each time), so its
  generator is seeded from the utterance's stream before the call (Praat's
  `random_initializeWithSeedUnsafelyButPredictably`) and made unpredictable again after it.

Cost: 40-100 ms per synth training utterance of 4.5-11 s (mean 59 ms at 6.9 s) on one core, decoding
and filter bank included (10 ms without the change); measured under load (asr/docs/data.md).
The draws of an utterance come from a stream seeded with (the run's seed, the epoch, the utterance
id), of its own: the other transforms draw what they drew before whether this is on or off.
"""
from __future__ import annotations

import hashlib
import math
import random
import warnings
from dataclasses import dataclass
from typing import Any

import numpy as np

PITCH_FLOOR_HZ = 75.0      # Praat's Change gender defaults for its pitch analysis
PITCH_CEILING_HZ = 600.0
MEDIAN_F0_LIMITS_HZ = (70.0, 350.0)
SPEAKER_FACTOR_KEYS = ("speaker_formant_range", "speaker_pitch_range", "speaker_intonation_range")


@dataclass(frozen=True)
class SpeakerChange:
    """One drawn speaker: the factors of Praat's Change gender, and the seed of Praat's random numbers."""
    formant_ratio: float
    pitch_factor: float
    intonation_factor: float
    praat_seed: int = 0


def speaker_stream(seed: int, epoch: int, cut_id: str) -> random.Random:
    digest = hashlib.sha1(f"speaker:{seed}:{epoch}:{cut_id}".encode()).hexdigest()
    return random.Random(int(digest[:16], 16))


def draw_speaker_change(cfg: Any, seed: int, epoch: int, cut_id: str) -> SpeakerChange | None:
    """The speaker an utterance is given in an epoch, or None (probability 1 - `cfg.speaker_prob`).
    `cfg`: the data.augment section (AugmentConfig)."""
    stream = speaker_stream(seed, epoch, cut_id)
    if not stream.random() < cfg.speaker_prob:
        return None
    factors = []
    for key in SPEAKER_FACTOR_KEYS:
        low, high = getattr(cfg, key)
        factors.append(math.exp(stream.uniform(math.log(low), math.log(high))))
    return SpeakerChange(*factors, praat_seed=stream.getrandbits(31))


def require_parselmouth() -> None:
    """ImportError saying what to install when praat-parselmouth is missing."""
    try:
        import parselmouth  # noqa: F401
    except ImportError as error:
        raise ImportError("data.augment.speaker_prob > 0 needs praat-parselmouth: "
                          "pip install praat-parselmouth==0.4.7 (or run .ci/install.sh)") from error


def pitch_track(samples: np.ndarray, sampling_rate: int):
    """(Praat Sound, its Pitch, the median F0 of the voiced frames or nan if none): Praat's
    autocorrelation tracker, 75-600 Hz."""
    import parselmouth
    from parselmouth.praat import call
    sound = parselmouth.Sound(np.asarray(samples, dtype=np.float64), float(sampling_rate))
    pitch = sound.to_pitch_ac(pitch_floor=PITCH_FLOOR_HZ, pitch_ceiling=PITCH_CEILING_HZ)
    return sound, pitch, float(call(pitch, "Get quantile", 0.0, 0.0, 0.5, "Hertz"))


def change_speaker(samples: np.ndarray, sampling_rate: int, change: SpeakerChange) -> np.ndarray:
    """`samples` (1-D float) spoken by the drawn speaker: Praat's Change gender with duration
    factor 1; float64, the same number of samples."""
    from parselmouth import PraatWarning
    from parselmouth.praat import call, run
    samples = np.asarray(samples, dtype=np.float64)
    if len(samples) < 3.0 * sampling_rate / PITCH_FLOOR_HZ:
        return samples.copy()
    sound, pitch, median = pitch_track(samples, sampling_rate)
    new_median = 0.0 if math.isnan(median) else float(np.clip(median * change.pitch_factor, *MEDIAN_F0_LIMITS_HZ))
    run(f"random_initializeWithSeedUnsafelyButPredictably ({change.praat_seed})")   # the module doc
    try:
        with warnings.catch_warnings():   # "no voiced segments found": an unvoiced utterance, expected
            warnings.simplefilter("ignore", PraatWarning)
            changed = call([sound, pitch], "Change gender", change.formant_ratio, new_median,
                           change.intonation_factor, 1.0)
    finally:
        run("random_initializeSafelyAndUnpredictably ()")
    out = changed.values[0]
    if len(out) >= len(samples):
        return out[:len(samples)].copy()
    return np.concatenate([out, np.zeros(len(samples) - len(out))])

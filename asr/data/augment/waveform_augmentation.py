"""Waveform augmentation of training utterances with lhotse's transforms: `data.augment`.

Synthetic voices are clean, close-talk and digital; real recordings have rooms, noise, microphones
and codecs. These are the transforms Kaldi, icefall and ESPnet use against that mismatch, applied
with lhotse's own cut methods (lhotse 1.33), to training utterances only:

    speed    `cut.perturb_speed(f)` for each factor f != 1 of `speed` (Kaldi's 0.9 / 1.0 / 1.1):
             a perturbed copy of every training utterance (id `<id>_sp0.9`), as Kaldi and icefall
             do; the copies' features are precomputed into the feature cache like the originals
             (the first run computes them, about 60 ms of resampling per utterance), and an epoch
             has len(speed) times as many utterances.
    speaker  with probability `speaker_prob`, another speaker: formants times r and the median
             pitch times p (Praat's Change gender through praat-parselmouth;
             asr/data/augment/speaker_change.py says how they are drawn).
    reverb   `cut.reverb_rir(rir)` (lhotse's ReverbWithImpulseResponse) with probability
             `reverb_prob`: a room response from `rir_source`, or a simulated room (see below).
    noise    `cut.mix(noise, snr)` with probability `noise_prob`, the SNR uniform in `noise_snr`
             dB: a recording from `noise_source`, or generated noise: white, pink or brown noise,
             or babble (three other training utterances, each at SNR + 10 log10 3, so their sum is
             at SNR).
    channel  with probability `channel_prob`, one of: a band limit at 5, 6 or 7 kHz (resampling to
             twice that and back, as lhotse's LowpassUsingResampling does), a telephone line
             (`cut.resample(8000).compress("gsm").resample(16000)`), or a lossy codec
             (`cut.compress("mp3" | "vorbis", level)`, lhotse's Compress; opus took 230 ms an
             utterance here, five times vorbis, and is left out).
    volume   `cut.perturb_volume(g)` with probability `volume_prob`, g log-uniform in `volume_range`.

They apply in that order (speed, speaker, room, noise in the room's output, then the line or codec,
then the level). Vocal tract length perturbation (asr/data/augment/vtlp.py, `vtlp_prob`) and SpecAugment
(asr/data/augment/specaugment.py) come after, on the features of the batch.

Decisions where lhotse does not serve us:
- Simulated rooms: lhotse's `FastRandomRIRGenerator` needs torchaudio (`highpass_biquad`), which
  does not import with the CPU torch. The room response is drawn here instead from the classic
  statistical model (Polack): a direct path, then from 2.5 ms on Gaussian noise decaying by 60 dB
  over the reverberation time T60 ~ U(0.2, 0.8) s, scaled to a direct-to-reverberant ratio
  ~ U(0, 12) dB; lhotse's ReverbWithImpulseResponse convolves with it (output energy normalised).
- `PerturbTempo` and `Narrowband` (mu-law/LPC10 telephone) also need torchaudio: tempo is left out,
  and the telephone line uses GSM 06.10 through soundfile (lhotse's Compress) instead.

Determinism: every draw for an utterance comes from its own stream, seeded from (the run's seed,
the epoch, the utterance id), so a batch is the same whatever the batch size, the DataLoader
workers or a resume from a checkpoint (the fault suite checks bit-exact resume with augmentation),
and each epoch draws afresh.

Cost: an utterance any of speaker/reverb/noise/channel/volume touches has its features computed from its
audio (decode, transforms, fbank) when its batch is built; the others are read from the cache.
recipes/asterisk/RESULTS.md gives the seconds per training step each costs.
"""
from __future__ import annotations

import hashlib
import io
import math
import random
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, List, Optional

import numpy as np
import soundfile
import torch
from lhotse import CutSet, MonoCut, Recording, RecordingSet, load_manifest

from asr.data.audio.command_sources import CommandNotAllowedError, announce_command, recording_commands, refuse_command
from asr.data.corpus.manifests import ManifestError
from asr.data.features.feature_cache import OnTheFlyFeatures, StoredFeatures, load_waveform, single_torch_thread
from asr.data.features.features import SAMPLING_RATE, FilterBank
from asr.data.augment.speaker_change import change_speaker, draw_speaker_change, require_parselmouth

GENERATED_NOISES = ("white", "pink", "brown", "babble")
BABBLE_TALKERS = 3
CODECS = ("mp3", "vorbis")
# lowpass by resampling to these rates and back: ratios to 16 kHz of 5/8, 3/4 and 7/8 keep lhotse's
# resampling kernels small (about 10 ms an utterance; 9 kHz or a random rate took 80-180 ms)
BAND_LIMIT_RATES = (10000, 12000, 14000)
CHANNELS = ("band_limit", "telephone", "codec")
T60_SECONDS = (0.2, 0.8)
DIRECT_TO_REVERBERANT_DB = (0.0, 12.0)
NOISE_AUDIO_SUFFIXES = (".wav", ".flac", ".ogg", ".mp3", ".opus", ".sph")
# the factors a speaker change or a VTLP warp may draw from: beyond them no human voice is left
FACTOR_RANGE_LIMITS = {"speaker_formant_range": (0.5, 2.0), "speaker_pitch_range": (0.25, 4.0),
                       "speaker_intonation_range": (0.25, 4.0), "vtlp_warp_range": (0.5, 2.0)}


@dataclass
class AugmentConfig:
    """The `data.augment:` section: waveform augmentation of training utterances (lhotse's transforms;
    asr/data/augment/waveform_augmentation.py). Everything off by default."""

    # speed perturbation factors: each factor other than 1 adds a perturbed copy of the training set (Kaldi's [0.9,1.0,1.1])
    speed: List[float] = field(default_factory=lambda: [1.0])
    reverb_prob: float = 0.0                 # probability an utterance is played in a room (simulated, or rir_source)
    rir_source: Optional[str] = None         # room impulse responses: a lhotse RecordingSet manifest or a folder of audio; None: simulated rooms
    noise_prob: float = 0.0                  # probability noise is added to an utterance
    noise_snr: List[float] = field(default_factory=lambda: [10.0, 20.0])   # [low, high] signal-to-noise ratio in dB, drawn uniformly
    noise_source: Optional[str] = None       # noise recordings: a lhotse RecordingSet manifest or a folder of audio; None: generated (white, pink, brown, babble)
    channel_prob: float = 0.0                # probability of a channel effect: a band limit, a telephone line (8 kHz GSM) or a lossy codec (mp3, vorbis)
    volume_prob: float = 0.0                 # probability of a level change
    volume_range: List[float] = field(default_factory=lambda: [0.125, 2.0])  # [low, high] gain factor, drawn log-uniformly
    # probability an utterance is given to another speaker: formant and pitch shifts (Praat's Change gender; asr/data/augment/speaker_change.py)
    speaker_prob: float = 0.0
    speaker_formant_range: List[float] = field(default_factory=lambda: [0.85, 1.2])   # [low, high] formant ratio (1/vocal tract length), drawn log-uniformly
    speaker_pitch_range: List[float] = field(default_factory=lambda: [0.65, 1.6])     # [low, high] factor of the median F0, drawn log-uniformly
    speaker_intonation_range: List[float] = field(default_factory=lambda: [0.8, 1.25])  # [low, high] factor of F0's excursions around its median
    # probability an utterance's features are warped in frequency: vocal tract length perturbation on the filter banks (asr/data/augment/vtlp.py)
    vtlp_prob: float = 0.0
    vtlp_warp_range: List[float] = field(default_factory=lambda: [0.8, 1.25])   # [low, high] warp factor alpha, drawn log-uniformly (>1: formants up)


def validate_augment_config(cfg: AugmentConfig) -> None:
    """ValueError naming the first bad `data.augment` option and what is allowed."""
    speed = list(cfg.speed)
    if not speed or any(not 0.5 <= float(f) <= 2.0 for f in speed) or len(set(speed)) != len(speed):
        raise ValueError(f"data.augment.speed={speed} must list distinct factors in [0.5, 2], e.g. [0.9,1.0,1.1] "
                         f"([1.0]: no speed perturbation)")
    if 1.0 not in [float(f) for f in speed]:
        raise ValueError(f"data.augment.speed={speed} must include 1.0 (the original utterances stay in training)")
    for name in ("reverb_prob", "noise_prob", "channel_prob", "volume_prob", "speaker_prob", "vtlp_prob"):
        value = getattr(cfg, name)
        if not 0.0 <= float(value) <= 1.0:
            raise ValueError(f"data.augment.{name}={value} must be a probability in [0, 1]")
    for name, lowest in (("noise_snr", -math.inf), ("volume_range", 0.0)):
        pair = list(getattr(cfg, name))
        if len(pair) != 2 or not lowest < float(pair[0]) <= float(pair[1]):
            raise ValueError(f"data.augment.{name}={pair} must be [low, high] with low <= high"
                             + (" and low > 0" if lowest == 0.0 else ""))
    for name, (lowest, highest) in FACTOR_RANGE_LIMITS.items():
        pair = list(getattr(cfg, name))
        if len(pair) != 2 or not lowest <= float(pair[0]) <= float(pair[1]) <= highest:
            raise ValueError(f"data.augment.{name}={pair} must be [low, high] with {lowest} <= low <= high <= {highest}")


def check_augment_sources(cfg: AugmentConfig) -> None:
    """ValueError naming `data.augment.noise_source` / `rir_source` when it is not there (checked by
    asr.train at start-up; an evaluation of a model trained with them never needs them)."""
    for name in ("rir_source", "noise_source"):
        value = getattr(cfg, name)
        if value is not None and not Path(value).exists():
            raise ValueError(f"data.augment.{name}={value!r} does not exist: give a lhotse RecordingSet manifest "
                             f"(python -m recipes.noise.prepare writes them) or a folder of audio files, or null")


def speed_factors(cfg: AugmentConfig) -> list[float]:
    """The speed factors that add copies (all but 1.0), in the order given."""
    return [float(f) for f in cfg.speed if float(f) != 1.0]


def transforms_on_the_fly(cfg: AugmentConfig) -> bool:
    """Whether any transform of the audio is drawn per utterance and epoch (everything but speed and
    VTLP, which warps the features: asr/data/augment/vtlp.py)."""
    return any(p > 0 for p in (cfg.speaker_prob, cfg.reverb_prob, cfg.noise_prob, cfg.channel_prob, cfg.volume_prob))


def with_speed_copies(cuts: CutSet, factors: list[float]) -> CutSet:
    """`cuts` followed by one speed-perturbed copy of every cut per factor (ids `<id>_sp<f>`)."""
    if not factors:
        return cuts
    originals = list(cuts)
    return CutSet.from_cuts(originals + [cut.perturb_speed(f) for f in factors for cut in originals])


def utterance_stream(seed: int, epoch: int, cut_id: str) -> random.Random:
    """The random stream of one utterance in one epoch (independent of batching and workers)."""
    digest = hashlib.sha1(f"augment:{seed}:{epoch}:{cut_id}".encode()).hexdigest()
    return random.Random(int(digest[:16], 16))


def in_memory_recording(samples: np.ndarray, recording_id: str, sampling_rate: int = SAMPLING_RATE) -> Recording:
    """A lhotse Recording holding `samples` (1-D float) as a float WAV in memory."""
    buffer = io.BytesIO()
    soundfile.write(buffer, np.asarray(samples, dtype=np.float32), sampling_rate, format="WAV", subtype="FLOAT")
    return Recording.from_bytes(buffer.getvalue(), recording_id)


def whole_cut(recording: Recording, cut_id: str, start: float = 0.0, duration: float | None = None) -> MonoCut:
    duration = recording.duration - start if duration is None else duration
    return MonoCut(id=cut_id, start=start, duration=duration, channel=0, recording=recording)


def coloured_noise(colour: str, num_samples: int, rng: np.random.Generator) -> np.ndarray:
    """Unit-variance noise with a 1/f^k power spectrum: white k=0, pink k=1, brown k=2."""
    exponent = {"white": 0.0, "pink": 1.0, "brown": 2.0}[colour]
    white = rng.standard_normal(num_samples)
    if exponent:
        spectrum = np.fft.rfft(white)
        frequencies = np.fft.rfftfreq(num_samples)
        frequencies[0] = frequencies[1] if num_samples > 1 else 1.0
        white = np.fft.irfft(spectrum / frequencies ** (exponent / 2), n=num_samples)
    return white / max(float(np.std(white)), 1e-12)


def simulated_room_response(rng: np.random.Generator, sampling_rate: int = SAMPLING_RATE) -> np.ndarray:
    """A room impulse response after Polack's statistical model (the module doc): a direct path and a
    Gaussian tail decaying by 60 dB over T60, at a drawn direct-to-reverberant ratio."""
    t60 = rng.uniform(*T60_SECONDS)
    drr_db = rng.uniform(*DIRECT_TO_REVERBERANT_DB)
    onset = int(0.0025 * sampling_rate)
    length = int(t60 * sampling_rate)
    times = np.arange(length - onset) / sampling_rate
    tail = rng.standard_normal(length - onset) * np.exp(-3.0 * math.log(10.0) * times / t60)  # -60 dB at t60
    tail *= math.sqrt(10.0 ** (-drr_db / 10.0) / float(np.sum(tail ** 2)))   # tail energy / direct energy = DRR
    response = np.zeros(length)
    response[0] = 1.0
    response[onset:] = tail
    return response


def recordings_of(source: str, allow_commands: bool = False) -> list[Recording]:
    """The recordings of a lhotse RecordingSet manifest, or of every audio file under a folder. A
    recording whose audio comes from a shell command is a ValueError unless `allow_commands`
    (data.allow_commands); with it, each command is logged here, before any of them runs."""
    path = Path(source)
    if path.is_dir():
        files = sorted(p for p in path.rglob("*") if p.suffix.lower() in NOISE_AUDIO_SUFFIXES)
        if not files:
            raise ValueError(f"{source}: no audio files ({', '.join(NOISE_AUDIO_SUFFIXES)}) in this folder")
        return [Recording.from_file(p) for p in files]
    manifest = load_manifest(path)
    if not isinstance(manifest, RecordingSet):
        raise ValueError(f"{source}: a {type(manifest).__name__} manifest, not a RecordingSet "
                         f"(take a *recordings*.jsonl.gz file)")
    recordings = list(manifest)
    for recording in recordings:
        for command in recording_commands(recording):
            try:
                refuse_command(source, f"recording {recording.id}", command, allow_commands)
            except CommandNotAllowedError as error:
                raise ManifestError(str(error)) from None
            announce_command(command)
    return recordings


class WaveformAugmenter:
    """Draws and applies the transforms of one training utterance: `augmented(cut, epoch)` gives the
    transformed cut, or None when no on-the-fly transform was drawn; `features(cut, epoch, stored)`
    the features a training batch gets."""

    def __init__(self, cfg: AugmentConfig, seed: int, filterbank: FilterBank, babble_cuts: list,
                 allow_commands: bool = False):
        validate_augment_config(cfg)
        self.cfg = cfg
        self.seed = int(seed)
        self.filterbank = filterbank
        self.babble_cuts = list(babble_cuts)   # the talkers of babble noise: the training utterances
        self.noise_recordings = recordings_of(cfg.noise_source, allow_commands) if cfg.noise_source else None
        self.room_recordings = recordings_of(cfg.rir_source, allow_commands) if cfg.rir_source else None
        if cfg.speaker_prob > 0:
            require_parselmouth()
        if cfg.noise_prob > 0 and self.noise_recordings is None and len(self.babble_cuts) <= BABBLE_TALKERS:
            raise ValueError(f"data.augment.noise_prob={cfg.noise_prob}: babble needs more than {BABBLE_TALKERS} "
                             f"training utterances")

    def features(self, cut, epoch: int, stored: StoredFeatures | OnTheFlyFeatures) -> torch.Tensor:
        """The features of `cut` in `epoch`: of its augmented audio when a transform is drawn for it,
        else from `stored` (the cache, or the plain audio)."""
        augmented = self.augmented(cut, epoch)
        if augmented is None:
            return stored.load(cut)
        with single_torch_thread():
            return self.filterbank(load_waveform(augmented))

    def augmented(self, cut, epoch: int):
        cfg = self.cfg
        speaker = draw_speaker_change(cfg, self.seed, epoch, cut.id)   # a stream of its own
        stream = utterance_stream(self.seed, epoch, cut.id)
        # one draw per transform, always in this order, so each decision has a fixed place in the stream
        reverb, noise, channel, volume = (stream.random() < p for p in
                                          (cfg.reverb_prob, cfg.noise_prob, cfg.channel_prob, cfg.volume_prob))
        if not (speaker or reverb or noise or channel or volume):
            return None
        numbers = np.random.default_rng(stream.getrandbits(64))
        original = cut
        if speaker:   # first: the voice itself, then where and how it is heard
            samples = change_speaker(load_waveform(cut), cut.sampling_rate, speaker)
            cut = whole_cut(in_memory_recording(samples, f"{cut.id}-speaker", cut.sampling_rate), cut.id)
        if reverb:
            cut = cut.reverb_rir(rir_recording=self._room(stream, numbers))
        if noise:
            cut = self._add_noise(cut, original, stream, numbers)
        if channel:
            cut = self._channel(cut, stream)
        if volume:
            low, high = cfg.volume_range
            cut = cut.perturb_volume(math.exp(stream.uniform(math.log(low), math.log(high))))
        return cut

    def _room(self, stream: random.Random, numbers: np.random.Generator) -> Recording:
        if self.room_recordings is not None:
            room = self.room_recordings[stream.randrange(len(self.room_recordings))]
            return room if room.sampling_rate == SAMPLING_RATE else room.resample(SAMPLING_RATE)
        return in_memory_recording(simulated_room_response(numbers), "simulated-room")

    def _add_noise(self, cut, original, stream: random.Random, numbers: np.random.Generator):
        low, high = self.cfg.noise_snr
        snr = stream.uniform(low, high)
        duration = cut.duration
        if self.noise_recordings is not None:
            recording = self.noise_recordings[stream.randrange(len(self.noise_recordings))]
            if recording.sampling_rate != SAMPLING_RATE:
                recording = recording.resample(SAMPLING_RATE)
            start = stream.uniform(0.0, max(0.0, recording.duration - duration))
            noise = whole_cut(recording, "noise", start, min(duration, recording.duration - start))
            return cut.mix(noise, offset_other_by=0.0, snr=snr).truncate(duration=duration)
        kind = GENERATED_NOISES[stream.randrange(len(GENERATED_NOISES))]
        if kind != "babble":
            samples = coloured_noise(kind, original.num_samples, numbers)
            return cut.mix(whole_cut(in_memory_recording(samples, f"{kind}-noise"), f"{kind}-noise"), snr=snr)
        talker_snr = snr + 10.0 * math.log10(BABBLE_TALKERS)
        talkers = 0
        while talkers < BABBLE_TALKERS:
            other = self.babble_cuts[stream.randrange(len(self.babble_cuts))]
            if other.recording_id == original.recording_id:
                continue
            offset = stream.uniform(0.0, max(0.0, duration - other.duration))
            cut = cut.mix(other, offset_other_by=offset, snr=talker_snr).truncate(duration=duration)
            talkers += 1
        return cut

    @staticmethod
    def _channel(cut, stream: random.Random):
        kind = CHANNELS[stream.randrange(len(CHANNELS))]
        rate = cut.sampling_rate
        if kind == "band_limit":
            return cut.resample(BAND_LIMIT_RATES[stream.randrange(len(BAND_LIMIT_RATES))]).resample(rate)
        if kind == "telephone":
            return cut.resample(8000).compress("gsm").resample(rate)
        return cut.compress(CODECS[stream.randrange(len(CODECS))], stream.uniform(0.5, 0.99))


def augment_config_from(value: Any) -> AugmentConfig:
    """An AugmentConfig from an AugmentConfig or a dict (unknown keys are an error)."""
    if isinstance(value, AugmentConfig):
        return value
    if not isinstance(value, dict):
        raise ValueError(f"data.augment must be a mapping of options, got {value!r}")
    known = set(AugmentConfig.__dataclass_fields__)
    unknown = sorted(set(value) - known)
    if unknown:
        raise ValueError(f"unknown data.augment options {unknown}; the options are: {', '.join(sorted(known))}")
    return AugmentConfig(**{key: list(v) if isinstance(v, (list, tuple)) else v for key, v in value.items()})

"""The speakers of the synthetic corpus and how one utterance is synthesised.

Speakers are synthesiser voices:
- espeak-ng: two American English accents (en-us, en-us-nyc) x 16 voice variants (the default
  voice, male m1-m7, female f1-f5, and the Klatt-synthesis variants klatt, klatt2, klatt3):
  32 speakers. Rate (words per minute) and pitch are drawn per utterance.
- flite: the four English voices shipped with Debian's flite: kal16 (diphone), awb, rms, slt
  (clustergen, recorded from three people). Duration stretch and mean F0 are drawn per utterance.

Speaker ids are stable strings: ``espeak-en-us-m3``, ``espeak-en-us-nyc-default``, ``flite-slt``.

espeak-ng writes 22.05 kHz audio, flite 16 kHz; sox (``-R``: repeatable, no random dither)
applies the utterance's gain and resamples to 16 kHz 16-bit FLAC, so the same plan gives the
same samples on every run.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

from asr.data.synthesiser_phonemes import espeak_to_arpabet, flite_to_arpabet

SAMPLING_RATE = 16000

# program -> the Debian package that provides it
REQUIRED_PROGRAMS = {"espeak-ng": "espeak-ng", "flite": "flite", "sox": "sox"}


class MissingSynthesiserError(RuntimeError):
    """A program the corpus generator runs is not installed."""


class SynthesisError(RuntimeError):
    """A synthesiser or sox failed on an utterance (a system problem, not a data problem)."""


def check_synthesisers() -> None:
    """Raise one ``MissingSynthesiserError`` naming every missing program and its Debian package."""
    missing = [program for program in REQUIRED_PROGRAMS if shutil.which(program) is None]
    if missing:
        packages = " ".join(sorted({REQUIRED_PROGRAMS[p] for p in missing}))
        raise MissingSynthesiserError(
            f"the synthetic corpus needs the program(s) {', '.join(missing)}, not found on PATH. "
            f"Install the Debian package(s): `sudo apt-get install -y {packages}` "
            f"(or run `bash .ci/install.sh`, which installs all system packages of this project)."
        )


@dataclass(frozen=True)
class Speaker:
    id: str
    engine: str  # "espeak-ng" or "flite"
    voice: str  # espeak-ng: "language+variant"; flite: the voice name


ESPEAK_LANGUAGES = ("en-us", "en-us-nyc")
ESPEAK_VARIANTS = ("default", "m1", "m2", "m3", "m4", "m5", "m6", "m7",
                   "f1", "f2", "f3", "f4", "f5", "klatt", "klatt2", "klatt3")
# Mean F0 (Hz) of each flite voice at its defaults, measured; the per-utterance pitch is a factor of it.
FLITE_VOICES = {"kal16": 95.0, "awb": 130.0, "rms": 100.0, "slt": 170.0}

SPEAKERS: tuple[Speaker, ...] = tuple(
    Speaker(f"espeak-{language}-{variant}", "espeak-ng",
            language if variant == "default" else f"{language}+{variant}")
    for language in ESPEAK_LANGUAGES for variant in ESPEAK_VARIANTS
) + tuple(Speaker(f"flite-{voice}", "flite", voice) for voice in FLITE_VOICES)
SPEAKERS_BY_ID = {speaker.id: speaker for speaker in SPEAKERS}

# Heard only in the test split: two per accent, male and female, one of them Klatt. All flite voices
# stay in training: there are only four and each is a differently built synthesiser.
HELD_OUT_SPEAKER_IDS = ("espeak-en-us-m4", "espeak-en-us-f2", "espeak-en-us-nyc-m6", "espeak-en-us-nyc-klatt2")
assert set(HELD_OUT_SPEAKER_IDS) <= set(SPEAKERS_BY_ID)

# Per-utterance voicing ranges (drawn uniformly).
ESPEAK_RATE_WPM = (140, 200)  # espeak-ng -s, default 175
ESPEAK_PITCH = (30, 70)  # espeak-ng -p, 0-99, default 50
FLITE_DURATION_STRETCH = (0.85, 1.2)  # > 1 is slower
FLITE_F0_FACTOR = (0.85, 1.2)
GAIN_DB = (-8.0, 0.0)  # never above 0: no clipping


@dataclass(frozen=True)
class SynthesisResult:
    phones: list[str]  # ARPABET_39
    num_samples: int  # at SAMPLING_RATE


def synthesise(text: str, speaker: Speaker, prosody: dict, gain_db: float, flac_path: Path) -> SynthesisResult:
    """Speak ``text`` with ``speaker`` into a 16 kHz FLAC file; return the phones it said.

    ``prosody`` holds the engine's settings: espeak-ng {"rate_wpm", "pitch"}; flite
    {"duration_stretch", "f0_mean_hz"}. Raises ``UnmappablePhonemeError`` (no file is left) when
    the synthesiser used a phoneme outside ARPAbet.
    """
    flac_path = Path(flac_path)
    raw_wav = flac_path.with_name(flac_path.stem + ".raw.wav")
    try:
        if speaker.engine == "espeak-ng":
            command = ["espeak-ng", "-v", speaker.voice, "-s", str(prosody["rate_wpm"]),
                       "-p", str(prosody["pitch"]), "-x", "--sep= ", "-w", str(raw_wav), text]
            phones = espeak_to_arpabet(_run(command))
        elif speaker.engine == "flite":
            command = ["flite", "-voice", speaker.voice,
                       "--setf", f"duration_stretch={prosody['duration_stretch']}",
                       "--setf", f"int_f0_target_mean={prosody['f0_mean_hz']}",
                       "-ps", "-t", text, "-o", str(raw_wav)]
            phones = flite_to_arpabet(_run(command))
        else:
            raise ValueError(f"unknown synthesiser engine {speaker.engine!r} of speaker {speaker.id!r}")
        # gain before resampling, so the resampler's overshoot cannot clip
        _run(["sox", "-R", "-D", "-V1", str(raw_wav), "-b", "16", "-c", "1", str(flac_path),
              "vol", f"{gain_db}dB", "rate", "-h", str(SAMPLING_RATE)])
    finally:
        raw_wav.unlink(missing_ok=True)
    import soundfile  # a worker-side import; keeps `import recipes.synth` light

    info = soundfile.info(str(flac_path))
    if info.samplerate != SAMPLING_RATE or info.channels != 1:
        raise SynthesisError(f"{flac_path}: expected 16 kHz mono, sox wrote {info.samplerate} Hz x {info.channels}")
    return SynthesisResult(phones=phones, num_samples=int(info.frames))


def _run(command: list[str]) -> str:
    try:
        done = subprocess.run(command, capture_output=True, text=True, check=False,
                              env={**os.environ, "LC_ALL": "C.UTF-8"})
    except FileNotFoundError as error:
        check_synthesisers()  # names every missing program and its package
        raise MissingSynthesiserError(str(error)) from error
    if done.returncode != 0:
        raise SynthesisError(f"`{' '.join(command)}` failed with exit status {done.returncode}: {done.stderr.strip()[-500:]}")
    return done.stdout

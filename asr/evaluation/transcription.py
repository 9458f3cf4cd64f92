"""Transcribing audio files with a checkpoint: the library behind `python -m asr.transcribe`
(whose docstring describes the options, the output and how long recordings are cut).

    outcome = transcribe(TranscribeConfig(checkpoint="best.ckpt", files=["talk.wav"]))

Audio is read (soundfile, else ffmpeg) and resampled to the model's rate (`read_audio`), cut
into pieces at quiet points (`cut_into_pieces`), the pieces batched and run with context
(`transcribe_files`), and each file's frames joined and decoded whole (`finish`). With
window=None a file is one piece: the encoder runs over the whole recording at once (one pass),
after `check_one_pass` has estimated its time and memory and refused what would not fit.
"""
from __future__ import annotations

import ctypes
import json
import math
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass, field
from fractions import Fraction
from pathlib import Path
from typing import Callable, Iterator, Optional

import numpy as np
import torch

from asr.core.output_paths import unwritable_reason
from asr.data.features.features import FilterBank
from asr.evaluation.evaluation import load_model
from asr.evaluation.attention_choice import evaluation_attention
from asr.model.ctc import BLANK_ID, decode_transcripts
from asr.model.recognizer import EVALUATION_SEED, SpeechRecognizer, seed_evaluation_batch


# what a folder is searched for (a file named on the command line is tried whatever its name)
AUDIO_EXTENSIONS = (".wav", ".flac", ".ogg", ".oga", ".opus", ".mp3", ".m4a", ".aac", ".wma", ".aif", ".aiff",
                    ".au", ".caf", ".w64", ".sph", ".nist", ".webm")


PROGRESS_BAR_FROM = 4          # files; fewer get no progress bar


ENERGY_SMOOTHING_FRAMES = 10   # 100 ms: a pause between words, not a stop closure inside one


class TranscriptionError(ValueError):
    """A usage error: an argument, or no audio to transcribe; the message says what to do."""


class AudioReadError(RuntimeError):
    """An audio file that cannot be read; the message names the file."""


@dataclass
class TranscribeConfig:
    checkpoint: Optional[str] = None     # the .ckpt to transcribe with (required)
    attention: Optional[str] = None      # attention spec; None: the one the model was trained with
    decoder: str = "greedy"              # greedy | beam (CTC prefix beam search, no LM) | lexicon (+ LM)
    beam_size: int = 8
    lexicon: Optional[str] = None        # decoder=lexicon: word -> phones file (needs lm=); None: the model's
    lm: Optional[str] = None             # ARPA (.arpa/.arpa.gz); None: the model's; none: no LM
    extra_lexicon: Optional[str] = None  # decoder=lexicon: entries added on top of the lexicon
    lm_weight: float = 1.0
    word_score: float = 0.0
    beam: int = 50                       # the lexicon decoder's beam
    restrict_lexicon: bool = False       # decode only the lexicon words the LM knows (else: <unk> probability)
    out: Optional[str] = None            # JSON lines file
    device: str = "cpu"                  # cpu | cuda | cuda:N
    seed: int = EVALUATION_SEED          # seeds the random hashing of clustered / LSH attention (>= 0)
    window: Optional[float] = 20.0       # seconds: the longest piece the model sees at once; None: one pass
    overlap: float = 2.0                 # seconds shared by neighbouring pieces (half on each side of a cut)
    batch_seconds: float = 200.0         # padded seconds of audio per batch
    threads: Optional[int] = None        # torch.set_num_threads (>= 1); None: torch's default
    progress: bool = True
    files: list = field(default_factory=list)   # the positional arguments


def audio_files(arguments: list[str]) -> list[Path]:
    """The files named, and the audio files (by extension) under the folders named, sorted per
    folder; TranscriptionError for a path that does not exist, is not a regular file, or is a folder
    without audio."""
    found: list[Path] = []
    for argument in arguments:
        path = Path(argument)
        if path.is_dir():
            inside = sorted(p for p in path.rglob("*") if p.is_file() and p.suffix.lower() in AUDIO_EXTENSIONS)
            if not inside:
                raise TranscriptionError(f"folder {path} holds no audio files ({', '.join(AUDIO_EXTENSIONS)})")
            found.extend(inside)
        elif path.is_file():
            found.append(path)
        elif path.exists():   # reading a FIFO waits for a writer that may never come
            raise TranscriptionError(f"{path} is not a regular file (a FIFO, device or socket); give an audio "
                                     "file or a folder of them")
        else:
            raise TranscriptionError(f"{path}: no such file or folder")
    return list(dict.fromkeys(found))     # a file named twice is transcribed once


@dataclass
class Audio:
    samples: np.ndarray      # mono float32 in [-1, 1] at the model's sample rate
    sample_rate: int         # the file's own rate
    channels: int            # the file's own channel count
    duration: float          # seconds


def _read_with_soundfile(path: Path) -> tuple[np.ndarray, int]:
    import soundfile
    data, rate = soundfile.read(str(path), dtype="float32", always_2d=True)
    return data, rate


def _read_with_ffmpeg(path: Path) -> tuple[np.ndarray, int]:
    probe = subprocess.run(["ffprobe", "-v", "error", "-select_streams", "a:0", "-show_entries",
                            "stream=sample_rate,channels", "-of", "json", str(path)],
                           capture_output=True, text=True)
    streams = json.loads(probe.stdout or "{}").get("streams") if probe.returncode == 0 else None
    if not streams:
        reason = probe.stderr.strip().splitlines()[-1] if probe.stderr.strip() else "no audio stream"
        raise AudioReadError(reason)
    rate, channels = int(streams[0]["sample_rate"]), int(streams[0]["channels"])
    decoded = subprocess.run(["ffmpeg", "-v", "error", "-nostdin", "-i", str(path), "-map", "0:a:0",
                              "-f", "f32le", "-acodec", "pcm_f32le", "-"], capture_output=True)
    if decoded.returncode != 0:
        raise AudioReadError(decoded.stderr.decode(errors="replace").strip().splitlines()[-1])
    data = np.frombuffer(decoded.stdout, dtype=np.float32)
    return data[: len(data) // channels * channels].reshape(-1, channels), rate


def resample(samples: np.ndarray, from_rate: int, to_rate: int) -> np.ndarray:
    """`samples` at `from_rate` -> at `to_rate` (polyphase FIR filter, scipy's Kaiser window)."""
    if from_rate == to_rate:
        return samples
    from scipy.signal import resample_poly
    ratio = Fraction(to_rate, from_rate)
    return resample_poly(samples, ratio.numerator, ratio.denominator).astype(np.float32)


def read_audio(path: Path, sample_rate: int) -> Audio:
    """The file's audio as mono float32 at `sample_rate`; AudioReadError saying why it cannot."""
    try:
        data, rate = _read_with_soundfile(path)
    except Exception as soundfile_error:        # soundfile raises several types for unreadable files
        if shutil.which("ffmpeg") is None or shutil.which("ffprobe") is None:
            raise AudioReadError(f"soundfile cannot read it ({soundfile_error}) and ffmpeg is not installed") from None
        try:
            data, rate = _read_with_ffmpeg(path)
        except AudioReadError as error:
            raise AudioReadError(f"neither soundfile ({soundfile_error}) nor ffmpeg ({error}) can read it") from None
    if data.size == 0:
        raise AudioReadError("it holds no samples")
    if not np.isfinite(data).all():   # NaN features would decode to an empty transcript, silently
        raise AudioReadError("it holds NaN or infinite samples")
    mono = data.mean(axis=1) if data.shape[1] > 1 else data[:, 0]
    return Audio(resample(np.ascontiguousarray(mono, dtype=np.float32), rate, sample_rate), rate, data.shape[1],
                 len(data) / rate)


def probe_duration(path: Path) -> float:
    """The file's duration in seconds, read from its header (for sorting); 0 when unknown, so the
    file is read first and a broken one is reported early."""
    try:
        import soundfile
        return float(soundfile.info(str(path)).duration)
    except Exception:
        return 0.0


@dataclass(frozen=True)
class Piece:
    """A piece of a recording, in feature frames: the model runs on [start, end); the frames
    [keep_start, keep_end) are this piece's own, the rest is context shared with its neighbours."""
    start: int
    end: int
    keep_start: int
    keep_end: int


def frame_energies(samples: np.ndarray, frame_shift: int) -> np.ndarray:
    """Energy (sum of squares) of each frame_shift block of samples (10 ms), for finding pauses.
    Linear, not log: averaged over 100 ms, a few silent frames inside speech do not outweigh a
    whole quiet pause."""
    blocks = samples[: len(samples) // frame_shift * frame_shift].reshape(-1, frame_shift).astype(np.float64)
    return np.square(blocks).sum(axis=1)


def cut_into_pieces(energies: np.ndarray, num_frames: int, window: int, context: int, step: int) -> list[Piece]:
    """Pieces of a recording of `num_frames` feature frames that the model sees at most `window`
    frames of at once: each cut lies at the quietest point (lowest `energies`, smoothed over
    ENERGY_SMOOTHING_FRAMES) between half a window and a full window (less the context on both
    sides) after the previous cut, and every piece gets `context` frames of the neighbouring audio
    on each side. Cuts and context are multiples of `step` (the encoder's subsampling), so each
    kept encoder frame of a piece is the frame at the same time in the whole recording."""
    window, context = window // step * step, math.ceil(context / step) * step
    if window - 2 * context < window // 2:
        raise ValueError(f"a window of {window} frames leaves no room for {context} frames of context on each side")
    if num_frames <= window:
        return [Piece(0, num_frames, 0, num_frames)]
    smoothed = np.convolve(energies, np.ones(ENERGY_SMOOTHING_FRAMES) / ENERGY_SMOOTHING_FRAMES, mode="same")
    cuts = [0]
    while num_frames - cuts[-1] + context > window:
        low, high = cuts[-1] + window // 2, cuts[-1] + window - 2 * context
        candidates = np.arange(math.ceil(low / step) * step, high + 1, step)
        candidates = candidates[candidates < len(smoothed)]
        cuts.append(int(candidates[np.argmin(smoothed[candidates])]) if len(candidates) else high // step * step)
    cuts.append(num_frames)
    return [Piece(max(0, a - context), min(num_frames, b + context), a, b) for a, b in zip(cuts, cuts[1:])]


@dataclass
class Recording:
    """A file being transcribed: its audio, its pieces, and the kept log-probs of each piece."""
    path: Path
    audio: Audio
    pieces: list[Piece]
    kept: dict[int, dict[str, torch.Tensor]] = field(default_factory=dict)   # piece -> head -> (T', V)

    @property
    def done(self) -> bool:
        return len(self.kept) == len(self.pieces)


# Features are computed this many frames at a time (60 s): the filter bank works in float64 on
# every frame's 512 FFT points, 1.5 GB at once for an hour.
FEATURE_BLOCK_FRAMES = 6000


def frame_features(frontend: FilterBank, samples: np.ndarray, start: int, end: int) -> torch.Tensor:
    """The features of frames [start, end) of `samples`, computed from just the samples they cover
    (the same numbers as those frames of the whole recording's features), FEATURE_BLOCK_FRAMES at a time."""
    out = torch.empty(end - start, frontend.num_mel_bins)
    for first in range(start, end, FEATURE_BLOCK_FRAMES):
        last = min(end, first + FEATURE_BLOCK_FRAMES)
        block = frontend(samples[first * frontend.frame_shift:(last - 1) * frontend.frame_shift + frontend.frame_length])
        assert len(block) == last - first
        out[first - start:last - start] = block
    return out


def piece_features(frontend: FilterBank, recording: Recording, piece: Piece) -> torch.Tensor:
    """The features of the frames [start, end) of the recording that `piece` covers."""
    return frame_features(frontend, recording.audio.samples, piece.start, piece.end)


def run_batch(model: SpeechRecognizer, frontend: FilterBank, batch: list[tuple[Recording, int]], batch_index: int,
              seed: int) -> None:
    """Runs the model on a batch of pieces and stores each piece's kept log-probs (on the CPU)."""
    features = [piece_features(frontend, recording, recording.pieces[index]) for recording, index in batch]
    lengths = torch.tensor([len(f) for f in features])
    padded = torch.nn.utils.rnn.pad_sequence(features, batch_first=True)
    seed_evaluation_batch(seed, batch_index)      # as asr.evaluate does
    with torch.no_grad():
        log_probs, out_lengths = model(padded.to(model.device), lengths.to(model.device))
    step = model.encoder.subsampling
    for row, ((recording, index), out_length) in enumerate(zip(batch, out_lengths.tolist())):
        piece = recording.pieces[index]
        first = (piece.keep_start - piece.start) // step
        last = out_length if piece.keep_end == piece.end else (piece.keep_end - piece.start) // step
        recording.kept[index] = {kind: scores[row, first:last].float().cpu() for kind, scores in log_probs.items()}


def mean_confidence(log_probs: torch.Tensor) -> float:
    """Mean posterior of the frames where the best path emits a token; with none, of the blanks."""
    best, tokens = log_probs.max(dim=-1)
    emitting = tokens != BLANK_ID
    chosen = best[emitting] if bool(emitting.any()) else best
    return float(chosen.exp().mean()) if len(chosen) else 0.0


def finish(model: SpeechRecognizer, recording: Recording, decoder: str, beam_size: int, word_decoder=None) -> dict:
    """The record of a transcribed file: duration and, per head, hypothesis and confidence; with a
    word_decoder (head, ParallelLexiconDecoder), also the words of that head through the lexicon."""
    record = {"file": str(recording.path), "duration": round(recording.audio.duration, 3)}
    head_decoder = "greedy" if decoder == "lexicon" else decoder
    for kind, tokenizer in model.tokenizers.items():
        joined = torch.cat([recording.kept[index][kind] for index in range(len(recording.pieces))])
        hypothesis = decode_transcripts(joined[None], torch.tensor([len(joined)]), tokenizer, head_decoder,
                                        beam_size)[0]
        confidence = mean_confidence(joined)   # NaN only from a model whose outputs are NaN: JSON null
        record[kind] = {"hypothesis": hypothesis,
                        "confidence": round(confidence, 4) if math.isfinite(confidence) else None}
        if word_decoder is not None and kind == word_decoder[0]:
            words = word_decoder[1].submit(joined.numpy()).get()
            record["lexicon"] = {"head": kind, "hypothesis": words}
    return record


def read_recording(path: Path, frontend, window: int | None, context: int, step: int, warn) -> Recording | str:
    """The file's audio cut into pieces (cut_into_pieces: at most `window` frames, `context` frames of
    the neighbouring audio on each side, on the encoder's `step`; window None: one piece, the whole
    file), or why it cannot be transcribed; `warn` gets the note on a file mixed down to mono."""
    try:
        audio = read_audio(path, frontend.sampling_rate)
    except AudioReadError as error:
        return str(error)
    num_frames = frontend.num_frames(len(audio.samples))
    if num_frames == 0:
        return f"it is shorter than one {frontend.frame_length_ms:g} ms feature frame"
    if audio.channels > 1:
        warn(f"note: {path} has {audio.channels} channels; mixed down to mono (their mean)")
    if window is None:
        return Recording(path, audio, [Piece(0, num_frames, 0, num_frames)])
    energies = frame_energies(audio.samples, frontend.frame_shift)
    return Recording(path, audio, cut_into_pieces(energies, num_frames, window, context, step))


# ---- one pass over a long recording -----------------------------------------------------------------
# A one-pass file longer than this gets an estimate of its time and memory first (and may be
# refused), and a progress line per encoder layer.
ONE_PASS_CHECK_SECONDS = 300.0
# The estimate runs the model on the file's first 60 s and 120 s and extrapolates them.
CALIBRATION_SECONDS = (60.0, 120.0)
# Refused: an estimated peak above this share of the memory available when the file starts.
MEMORY_SHARE = 0.9


@dataclass(frozen=True)
class OnePassEstimate:
    seconds: float
    peak_bytes: float | None       # above what was resident before; None where it cannot be measured
    available_bytes: float | None  # the memory available to the process when the estimate was made


def limit_heap_growth() -> None:
    """Makes glibc give every freed allocation over 1 MiB back to the system at once. By default it
    raises that threshold to the largest block freed so far (up to 32 MiB), and a one-pass run's
    per-layer tensors of tens of MB then stay in the heap, fragmenting it: the resident memory of
    an hour grew to several times what was live. Nothing happens on other C libraries."""
    try:
        ctypes.CDLL("libc.so.6").mallopt(-3, 1 << 20)    # M_MMAP_THRESHOLD
    except (OSError, AttributeError):
        pass


def process_status_kib(field_name: str) -> int | None:
    """A kB field of this process's /proc/self/status (VmRSS, VmHWM); None where there is none."""
    try:
        with open("/proc/self/status") as status:
            for line in status:
                if line.startswith(field_name + ":"):
                    return int(line.split()[1])
    except OSError:
        return None
    return None


def _reset_peak_resident() -> bool:
    """Resets the kernel's record of this process's peak resident memory (Linux); False where it cannot."""
    try:
        with open("/proc/self/clear_refs", "w") as clear_refs:
            clear_refs.write("5")
        return True
    except OSError:
        return False


def available_memory_bytes() -> float | None:
    """What the system can still give this process: MemAvailable, or less under a cgroup limit."""
    available = None
    try:
        with open("/proc/meminfo") as meminfo:
            for line in meminfo:
                if line.startswith("MemAvailable:"):
                    available = int(line.split()[1]) * 1024.0
    except OSError:
        return None
    try:
        limit = Path("/sys/fs/cgroup/memory.max").read_text().strip()
        used = Path("/sys/fs/cgroup/memory.current").read_text().strip()
        if limit != "max" and available is not None:
            available = min(available, float(limit) - float(used))
    except (OSError, ValueError):
        pass
    return available


def _timed_run(model: SpeechRecognizer, features: torch.Tensor) -> tuple[float, float | None]:
    """Seconds and peak resident bytes above the resident memory before, of the model on `features`."""
    before = process_status_kib("VmRSS")
    measured = before is not None and _reset_peak_resident()
    started = time.perf_counter()
    with torch.no_grad():
        model(features[None].to(model.device), torch.tensor([len(features)], device=model.device))
    seconds = time.perf_counter() - started
    peak = process_status_kib("VmHWM") if measured else None
    return seconds, (None if peak is None else max(0.0, (peak - before) * 1024.0))


def estimate_one_pass(model: SpeechRecognizer, features: torch.Tensor, quadratic: bool,
                      num_frames: int) -> OnePassEstimate:
    """Time and peak memory of one pass over `num_frames` frames, from runs over the first
    CALIBRATION_SECONDS of `features`: time a + b n through the two runs (b n + c n^2 for an
    attention whose cost grows with the square of the length, attention_ext's `quadratic_time`),
    memory a + b n (every attention's memory is linear in the length)."""
    frames_per_second = 1000.0 / model.frontend.frame_shift_ms
    lengths = [min(num_frames, int(seconds * frames_per_second)) for seconds in CALIBRATION_SECONDS]
    _timed_run(model, features[: lengths[0]])          # warm-up: first-call allocations and kernel choices
    (t1, m1), (t2, m2) = (_timed_run(model, features[:n]) for n in lengths)
    n1, n2, n = float(lengths[0]), float(lengths[1]), float(num_frames)
    if quadratic:
        c = max(0.0, (t2 / n2 - t1 / n1) / (n2 - n1))
        seconds = (t1 / n1 - c * n1) * n + c * n * n
    else:
        slope = max(0.0, (t2 - t1) / (n2 - n1))
        seconds = t1 + slope * (n - n1)
    peak = None
    if m1 is not None and m2 is not None:
        peak = m2 + max(m2 - m1, 0.0) / (n2 - n1) * (n - n2)
    return OnePassEstimate(max(seconds, t2), peak, available_memory_bytes())


def check_one_pass(model: SpeechRecognizer, recording: "Recording", warn) -> None:
    """For a one-pass file over ONE_PASS_CHECK_SECONDS: prints the estimate and raises
    TranscriptionError, with the numbers and what to do instead, when it would not fit in memory."""
    from attention_ext import available_attentions
    num_frames = recording.pieces[0].end
    frontend = model.frontend
    calibration = frame_features(frontend, recording.audio.samples, 0,
                                 min(num_frames, int(CALIBRATION_SECONDS[1] * 1000.0 / frontend.frame_shift_ms)))
    attention = model.encoder.attention_name
    estimate = estimate_one_pass(model, calibration, available_attentions()[attention].quadratic_time, num_frames)
    minutes = recording.audio.duration / 60.0
    memory = "" if estimate.peak_bytes is None else f", peak memory about {estimate.peak_bytes / 1e9:.1f} GB"
    warn(f"{recording.path}: one pass over {minutes:.1f} min with {attention} attention: about "
         f"{estimate.seconds:.0f} s{memory} (estimated from its first {CALIBRATION_SECONDS[0]:g} and "
         f"{CALIBRATION_SECONDS[1]:g} s)")
    if estimate.peak_bytes is not None and estimate.available_bytes is not None \
            and estimate.peak_bytes > MEMORY_SHARE * estimate.available_bytes:
        raise TranscriptionError(
            f"one pass over its {minutes:.1f} min with {attention} attention would need about "
            f"{estimate.peak_bytes / 1e9:.1f} GB, more than the {estimate.available_bytes / 1e9:.1f} GB "
            f"available; transcribe it in pieces (window=20, the default) or in one pass with an attention "
            f"whose cost is linear in the length (attention=iclustered-100 or clustered-100)")


def report_layers(model: SpeechRecognizer, recording: "Recording", warn):
    """Forward hooks that print a line as each encoder layer finishes; returns their handles."""
    started, layers = time.perf_counter(), len(model.encoder.layers)

    def hook(index: int):
        return lambda module, inputs, output: warn(
            f"{recording.path}: layer {index + 1}/{layers} done ({time.perf_counter() - started:.1f} s)")
    return [layer.register_forward_hook(hook(index)) for index, layer in enumerate(model.encoder.layers)]


@dataclass
class Outcome:
    records: list[dict]                  # transcribed files, in the order they finished
    failures: dict[str, str]             # file -> why it was skipped


def transcribe_files(model: SpeechRecognizer, files: list[Path], config: TranscribeConfig,
                     emit=lambda record: None, warn=lambda message: None, word_decoder=None) -> Outcome:
    """Transcribes `files` (shortest first, pieces batched up to config.batch_seconds of padded
    audio); `emit` gets each file's record as soon as it is done, `warn` each note and failure;
    `word_decoder` (head, ParallelLexiconDecoder) adds each file's lexicon words."""
    from tqdm.auto import tqdm
    frontend = model.frontend
    frames_per_second = 1000.0 / frontend.frame_shift_ms
    window = None if config.window is None else int(config.window * frames_per_second)
    context = int(config.overlap / 2 * frames_per_second)
    budget = config.batch_seconds * frames_per_second          # padded frames per batch
    step = model.encoder.subsampling
    outcome = Outcome([], {})
    ordered = sorted(files, key=probe_duration)
    bar = tqdm(total=len(ordered), desc="transcribe", unit="file", leave=False,
               disable=not config.progress or len(ordered) < PROGRESS_BAR_FROM)

    def fail(path: Path, reason: str) -> None:
        outcome.failures[str(path)] = reason
        warn(f"skipped {path}: {reason}")
        emit({"file": str(path), "error": reason})
        bar.update(1)

    def recordings() -> Iterator[Recording]:
        for path in ordered:
            recording = read_recording(path, frontend, window, context, step, warn)
            if not isinstance(recording, Recording):
                fail(path, recording)
                continue
            if window is None and recording.audio.duration > ONE_PASS_CHECK_SECONDS:
                try:
                    check_one_pass(model, recording, warn)
                except TranscriptionError as refusal:
                    fail(path, str(refusal))
                    continue
            yield recording

    pending: list[Recording] = []
    batch: list[tuple[Recording, int]] = []
    batch_index = 0

    def flush() -> None:
        nonlocal batch, batch_index
        if batch:
            long_files = [recording for recording, _ in batch
                          if window is None and recording.audio.duration > ONE_PASS_CHECK_SECONDS]
            hooks = [hook for recording in long_files for hook in report_layers(model, recording, warn)]
            try:
                run_batch(model, frontend, batch, batch_index, config.seed)
            finally:
                for hook in hooks:
                    hook.remove()
            batch_index += 1
            batch = []
        for recording in [r for r in pending if r.done]:
            record = finish(model, recording, config.decoder, config.beam_size, word_decoder)
            outcome.records.append(record)
            emit(record)
            pending.remove(recording)
            bar.update(1)

    for recording in recordings():
        pending.append(recording)
        for index, piece in enumerate(recording.pieces):
            longest = max([piece.end - piece.start] + [r.pieces[i].end - r.pieces[i].start for r, i in batch])
            if batch and longest * (len(batch) + 1) > budget:
                flush()
            batch.append((recording, index))
    flush()
    bar.close()
    return outcome


def format_line(record: dict, kinds: list[str]) -> str:
    return "\t".join([record["file"], f"{record['duration']:.2f}s"]
                     + [f"{kind}: {record[kind]['hypothesis']}" for kind in kinds]
                     + ([f"lexicon: {record['lexicon']['hypothesis']}"] if "lexicon" in record else []))


def start_lexicon_decoder(model: SpeechRecognizer, config: TranscribeConfig):
    """decoder=lexicon: (head, ParallelLexiconDecoder) with the lexicon and LM given, or else the
    model's (asr.model.decoding_files.model_decoding_files); None for the other decoders."""
    if config.decoder != "lexicon":
        return None
    from asr.evaluation.decoding.evaluation import settings_from_command, start_word_decoder
    from asr.model.decoding_files import model_decoding_files
    settings = settings_from_command(config, model_decoding_files(config.checkpoint))
    return start_word_decoder(model.tokenizers, settings, workers=1)


def transcribe(config: TranscribeConfig, attention_options: dict[str, str] | None = None,
               print_line=print, warn: Callable[[str], None] = lambda message: print(message, file=sys.stderr)
               ) -> Outcome:
    """Transcribes config.files; each file's line goes to `print_line` (and to config.out as JSON),
    what could not be read to `warn`."""
    if config.out:   # before the model is loaded and any file decoded
        reason = unwritable_reason(config.out, folder=False)
        if reason is not None:
            raise TranscriptionError(f"out={config.out} cannot be written: {reason}; give a file you can write to")
    if config.threads:
        torch.set_num_threads(config.threads)
    if config.window is None:
        limit_heap_growth()
    files = audio_files(config.files)
    model = load_model(config.checkpoint, config.device)
    model.set_attention(evaluation_attention(model, config.attention, attention_options))
    kinds = list(model.tokenizers)
    word_decoder = start_lexicon_decoder(model, config)
    if config.out:
        Path(config.out).parent.mkdir(parents=True, exist_ok=True)
    out = open(config.out, "w") if config.out else None
    try:
        def emit(record: dict) -> None:
            if "error" not in record:
                print_line(format_line(record, kinds))
            if out is not None:
                out.write(json.dumps(record, allow_nan=False) + "\n")   # JSON has no NaN
                out.flush()
        return transcribe_files(model, files, config, emit,
                                warn=warn,
                                word_decoder=word_decoder)
    finally:
        if out is not None:
            out.close()
        if word_decoder is not None:
            word_decoder[1].close()

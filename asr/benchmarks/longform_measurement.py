"""One measurement of the long-form benchmark, in a process of its own so that its peak resident
memory is its alone: `python -m asr.benchmarks.longform_measurement REQUEST.json RESULT.json`,
started by asr.benchmarks.longform (which see).

The recording is transcribed by asr.evaluation.transcription.transcribe (greedy) and timed; the
peak resident memory (VmHWM) is read right after. Then, when asked, the same recording is
transcribed again with decoder=lexicon (the model's lexicon and LM, as `asr.transcribe
decoder=lexicon`) for the WER, timed apart. The result file holds PER, WER, both times and the
peak memory.
"""
from __future__ import annotations

import json
import resource
import sys
import time
from pathlib import Path

from asr.data.corpus.long_recordings import read_long_recording
from asr.evaluation.transcription import TranscribeConfig, process_status_kib, transcribe
from asr.text.metrics import phone_error_rate, word_error_rate

def mode_settings(mode: str, recording_seconds: float) -> dict:
    """The TranscribeConfig fields of a mode: pieces, asr.transcribe's defaults; onepass, window=None
    (the whole recording through the encoder at once; asr.transcribe window=none)."""
    if mode == "pieces":
        return {}
    if mode != "onepass":
        raise ValueError(f"mode {mode!r} is neither pieces nor onepass")
    return {"window": None}


def peak_resident_mb() -> float:
    """This process's peak resident memory so far (VmHWM; ru_maxrss where /proc is missing)."""
    peak_kib = process_status_kib("VmHWM")
    if peak_kib is not None:
        return peak_kib / 1024
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak / 1024 / (1024 if sys.platform == "darwin" else 1)     # bytes on macOS, kB on Linux


def transcribed(config: TranscribeConfig, attention_options: dict) -> tuple[dict, float]:
    """The recording's record and the seconds transcribe() took; RuntimeError when it failed."""
    started = time.perf_counter()
    outcome = transcribe(config, attention_options, print_line=lambda line: None,
                         warn=lambda message: print(message, file=sys.stderr))
    seconds = time.perf_counter() - started
    if outcome.failures or not outcome.records:
        raise RuntimeError(f"transcribing {config.files[0]} failed: {outcome.failures}")
    return outcome.records[0], seconds


def measure(request: dict) -> dict:
    """request: checkpoint, recording (a long recording's folder), attention (a spec),
    attention_options, mode, threads, phone_head, phone_set, wer (bool), decoding (lexicon
    options of TranscribeConfig)."""
    recording = read_long_recording(request["recording"])
    config = TranscribeConfig(checkpoint=request["checkpoint"], attention=request["attention"], decoder="greedy",
                              threads=request.get("threads"), progress=False, files=[str(recording.audio_path)],
                              **mode_settings(request["mode"], recording.duration))
    record, seconds = transcribed(config, request.get("attention_options") or {})
    result = {"recording_seconds": recording.duration, "wall_s": seconds, "rtf": seconds / recording.duration,
              "peak_rss_mb": peak_resident_mb(), "per": None, "wer": None, "lexicon_wall_s": None}
    head = request.get("phone_head")
    if head is not None:
        result["per"] = phone_error_rate([recording.joined_phones()], [record[head]["hypothesis"]],
                                         request.get("phone_set") or "arpabet39")
    if request.get("wer"):
        for key, value in (request.get("decoding") or {}).items():
            setattr(config, key, value)
        config.decoder = "lexicon"
        words, result["lexicon_wall_s"] = transcribed(config, request.get("attention_options") or {})
        result["wer"] = word_error_rate([recording.joined_words()], [words["lexicon"]["hypothesis"]])
    return result


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 2:
        print("usage: python -m asr.benchmarks.longform_measurement REQUEST.json RESULT.json (started by "
              "python -m asr.benchmarks.longform)", file=sys.stderr)
        return 2
    result = measure(json.loads(Path(argv[0]).read_text()))
    Path(argv[1]).write_text(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())

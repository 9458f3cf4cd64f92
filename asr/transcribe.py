"""Transcribe audio files with a trained checkpoint.

    python -m asr.transcribe checkpoint=runs/synth_full/<time>/checkpoints/best.ckpt talk.wav
    python -m asr.transcribe checkpoint=best.ckpt recordings/ more.flac out=transcripts.jsonl
    python -m asr.transcribe checkpoint=best.ckpt a.mp3 attention=i-clustered-100 decoder=beam device=cuda
    python -m asr.transcribe checkpoint=best.ckpt talk.wav decoder=lexicon [lexicon=PATH lm=PATH|none]
    python -m asr.transcribe checkpoint=best.ckpt talk.wav decoder=lexicon extra_lexicon=new_words.txt

Arguments: audio files and folders (walked for audio files, see AUDIO_EXTENSIONS), and key=value
options (see `TranscribeConfig` below): `attention` (a spec as in asr.evaluate; default the one the
model was trained with) and `attention.<option>=<value>`, `decoder` (greedy | beam | lexicon, as in
asr.evaluate), `beam_size`, `out` (JSON lines), `device`, `seed`, `window`, `overlap`,
`batch_seconds`, `threads`, `progress`; for decoder=lexicon also `lexicon`, `lm` (default: the
model's, found as asr.evaluate finds them, from any working folder; lexicon= needs lm=, a path or
none for the lexicon alone), `extra_lexicon` (entries on top of the lexicon), `lm_weight`,
`word_score`, `beam`, `restrict_lexicon`.

Audio: whatever soundfile reads (wav, flac, ogg, mp3 with libsndfile >= 1.1, ...), else whatever
ffmpeg reads (m4a, ...), at any sample rate: resampled to the model's (polyphase filter,
scipy.signal.resample_poly); several channels are mixed down to their mean, with a note on stderr.
Features are computed by the front-end stored in the checkpoint, exactly as in training.

Output: one line per file on stdout, in the order the files finish (shortest first):
    <file>\t<duration>s\t<head>: <hypothesis>\t<head>: <hypothesis> ...[\tlexicon: <words>]
and with out=PATH one JSON object per line:
    {"file": ..., "duration": seconds, "<head>": {"hypothesis": ..., "confidence": ...}, ...,
     "lexicon": {"head": <the head decoded>, "hypothesis": <words>}}     (decoder=lexicon only)
(a file that failed: {"file": ..., "error": ...}; NaN or infinite samples are such a failure). A
head's confidence is the mean posterior of the frames where the best path emits a token (the mean
blank posterior when it emits none; null if the model's outputs are not numbers).
decoder=lexicon decodes the words of the phone head (or the first head, when there is none)
through the lexicon and LM, as asr.evaluate does; every head also keeps its greedy hypothesis.

Long recordings: a file longer than `window` seconds (default 20, longer than any synth or TIMIT
training utterance) is cut at low-energy points (the quietest 100 ms in the second half of each
window) into pieces; each piece is run with `overlap` / 2 seconds (default 1) of the neighbouring
audio on each side as context, the encoder's output frames of the piece itself are kept, and the
kept frames of all pieces are joined into one sequence that the decoder decodes as a whole (so no
token is doubled or lost at a join, and beam search sees the whole file). The model never sees
more than `window` seconds at once; the audio of one file is held in memory (64 kB per second).

One pass: `window=none` runs each file's whole feature sequence through the encoder at once, with
any attention; the output is the same. Features are computed 60 s at a time and long inputs run
through the front end and the feed-forward blocks in pieces, so memory grows with the length only
through what the attention needs. A file over 5 minutes first gets an estimate of its time and
peak memory (from runs over its first 60 and 120 s, extrapolated as the attention's cost grows:
linearly, or with the square of the length for full, shared_full and oracle_top), printed on
stderr, and is skipped, with the numbers and what to do instead, when it would not fit in the
memory available; while it runs, a line on stderr says when each encoder layer is done.

Batches: files are sorted by duration and their pieces batched up to `batch_seconds` of padded
audio. Unreadable files are reported by name on stderr and skipped; the exit status is 1 when any
file failed, 2 for a usage error (bad option, checkpoint, no audio files), 0 otherwise.
"""
from __future__ import annotations

import sys
from pathlib import Path

from asr.config.command_line import key_value_config, run_key_value_command
from asr.evaluation.decoding.lexicon import LexiconFileError
from asr.evaluation.decoding.ngram import LanguageModelError
from asr.evaluation.evaluation import check_decoding_options
from asr.core.errors import EvaluationError
from asr.core.exit_status import FAILURE, SUCCESS
from asr.model.checkpoint import CheckpointError
from asr.evaluation.transcription import TranscribeConfig, TranscriptionError, transcribe
from attention_ext import AttentionConfigError

COMMAND = "asr.transcribe"


# ---- arguments ------------------------------------------------------------------------------------
def parse_arguments(argv: list[str]) -> tuple[TranscribeConfig, dict[str, str]]:
    """Arguments -> (config, attention.<option> values). An argument without '=' (or naming an
    existing path) is a file or folder to transcribe."""
    paths, dotlist, attention_options = [], [], {}
    for argument in argv:
        key, equals, value = argument.partition("=")
        if not equals or Path(argument).exists():
            paths.append(argument)
        elif key.startswith("attention."):
            attention_options[key.removeprefix("attention.")] = value
        elif key == "window" and value.lower() == "none":
            dotlist.append("window=null")        # one pass: the whole file at once
        else:
            dotlist.append(argument)
    known = [name for name in TranscribeConfig.__dataclass_fields__ if name != "files"]
    if any(item.partition("=")[0] == "files" for item in dotlist):
        raise TranscriptionError("give the audio files and folders as plain arguments, not files=...")
    config = key_value_config(TranscribeConfig, dotlist, TranscriptionError, noun="options", known=known,
                              also=", attention.<option>")
    config.files = paths
    if not config.checkpoint:
        raise TranscriptionError("give the checkpoint to transcribe with: checkpoint=PATH (a .ckpt file, e.g. "
                                 "runs/<preset>/<time>/checkpoints/best.ckpt)")
    if not paths:
        raise TranscriptionError("give audio files or folders to transcribe, e.g. "
                                 "python -m asr.transcribe checkpoint=best.ckpt talk.wav recordings/")
    if config.window is not None:
        if not config.window >= 1.0:
            raise TranscriptionError(f"window={config.window} must be at least 1 second, or none (one pass)")
        if not 0.2 <= config.overlap <= config.window / 2:
            raise TranscriptionError(f"overlap={config.overlap} must lie between 0.2 seconds (the encoder's "
                                     f"context at a join) and window / 2 = {config.window / 2}")
        if not config.batch_seconds >= config.window:
            raise TranscriptionError(f"batch_seconds={config.batch_seconds} must be at least window={config.window}")
    elif not config.batch_seconds > 0:
        raise TranscriptionError(f"batch_seconds={config.batch_seconds} must be > 0")
    try:
        check_decoding_options(config)
    except EvaluationError as error:
        raise TranscriptionError(str(error)) from None
    return config, attention_options


# ---- the command ----------------------------------------------------------------------------------
def main(argv: list[str] | None = None) -> int:
    return run_key_value_command(COMMAND, __doc__, _transcribe_and_report, argv,
                                 usage_errors=(TranscriptionError, AttentionConfigError, CheckpointError,
                                               LexiconFileError, LanguageModelError))


def _transcribe_and_report(argv: list[str]) -> int:
    config, attention_options = parse_arguments(argv)
    from tqdm.auto import tqdm
    outcome = transcribe(config, attention_options, print_line=tqdm.write,
                         warn=lambda message: print(f"{COMMAND}: {message}", file=sys.stderr))
    if outcome.failures:
        names = ", ".join(outcome.failures)
        print(f"{COMMAND}: error: {len(outcome.failures)} of {len(outcome.failures) + len(outcome.records)} "
              f"files could not be transcribed: {names}", file=sys.stderr)
        return FAILURE
    return SUCCESS


if __name__ == "__main__":
    sys.exit(main())

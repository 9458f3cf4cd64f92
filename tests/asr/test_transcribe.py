"""python -m asr.transcribe: audio files in, the same hypotheses as asr.evaluate out."""
from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest
import soundfile
import torch

from asr.evaluation.evaluation import EvaluateConfig, evaluate
from asr.core.exit_status import FAILURE, SUCCESS, USAGE_ERROR
from asr.model import encoder as encoder_module
from asr.model.recognizer import SpeechRecognizer
from asr.transcribe import main
from asr.evaluation.transcription import (Piece, TranscribeConfig, cut_into_pieces, frame_energies, resample,
                               transcribe_files)


@pytest.fixture
def tiny_checkpoint(tiny_epochs_run) -> Path:
    return tiny_epochs_run / "checkpoints" / "best.ckpt"


def transcribed(path: Path) -> dict[str, dict]:
    return {Path(r["file"]).stem: r for r in map(json.loads, path.read_text().splitlines())}


def test_the_test_split_transcribes_to_evaluates_hypotheses(tiny_checkpoint, tiny_synth, tmp_path, capsys):
    report = evaluate(EvaluateConfig(checkpoint=str(tiny_checkpoint), split="test", out=str(tmp_path / "eval"),
                                     progress=False))
    expected = {r["id"]: r for r in map(json.loads, (tmp_path / "eval" / "hypotheses.jsonl").read_text().splitlines())}
    audio = tiny_synth / "audio" / "test"
    assert main([f"checkpoint={tiny_checkpoint}", str(audio), f"out={tmp_path / 'out.jsonl'}"]) == SUCCESS
    got = transcribed(tmp_path / "out.jsonl")
    assert set(got) == set(expected) and report["utterances"] == len(got) == 2
    for utterance, record in got.items():
        assert record["duration"] == pytest.approx(soundfile.info(str(audio / f"{utterance}.flac")).duration, abs=1e-3)
        for kind in ("phones", "chars"):
            assert record[kind]["hypothesis"] == expected[utterance][kind]["hypothesis"]
            assert 0.0 < record[kind]["confidence"] <= 1.0
    lines = capsys.readouterr().out.splitlines()     # one line per file: file, duration, each head
    assert len(lines) == 2 and all(line.split("\t")[2].startswith("phones: ") for line in lines)


def test_a_broken_file_is_named_skipped_and_fails_the_exit_status(tiny_checkpoint, tiny_synth, tmp_path, capsys):
    folder = tmp_path / "audio"
    shutil.copytree(tiny_synth / "audio" / "test", folder)
    (folder / "broken.wav").write_bytes(b"RIFF not really a wave file")
    (folder / "notes.txt").write_text("not audio, not picked up from a folder")
    status = main([f"checkpoint={tiny_checkpoint}", str(folder), f"out={tmp_path / 'out.jsonl'}"])
    assert status == FAILURE
    err = capsys.readouterr().err
    assert f"skipped {folder / 'broken.wav'}" in err and "1 of 3 files could not be transcribed" in err
    records = transcribed(tmp_path / "out.jsonl")
    assert set(records) == {"broken"} | {p.stem for p in (tiny_synth / "audio" / "test").glob("*.flac")}
    assert "error" in records["broken"] and "notes" not in records
    assert main([f"checkpoint={tiny_checkpoint}", str(tmp_path / "missing.wav")]) == USAGE_ERROR
    assert main([f"checkpoint={tiny_checkpoint}", str(folder), "decoder=viterbi"]) == USAGE_ERROR
    assert main([str(folder)]) == USAGE_ERROR
    err = capsys.readouterr().err.splitlines()
    assert err == [f"asr.transcribe: error: {tmp_path / 'missing.wav'}: no such file or folder",
                   "asr.transcribe: error: decoder='viterbi'; choose one of greedy, beam, lexicon",
                   "asr.transcribe: error: give the checkpoint to transcribe with: checkpoint=PATH (a .ckpt file, "
                   "e.g. runs/<preset>/<time>/checkpoints/best.ckpt)"]


def test_stereo_is_mixed_down_saying_so_and_other_formats_are_read(tiny_checkpoint, tiny_synth, tmp_path, capsys):
    source = sorted((tiny_synth / "audio" / "test").glob("*.flac"))[0]
    samples, rate = soundfile.read(str(source), dtype="float32")
    soundfile.write(str(tmp_path / "stereo.wav"), np.stack([samples, samples], axis=1), rate, subtype="FLOAT")
    soundfile.write(str(tmp_path / "mono.ogg"), samples, rate)
    assert main([f"checkpoint={tiny_checkpoint}", str(source), str(tmp_path / "stereo.wav"), str(tmp_path / "mono.ogg"),
                 f"out={tmp_path / 'out.jsonl'}"]) == SUCCESS
    assert f"note: {tmp_path / 'stereo.wav'} has 2 channels; mixed down to mono" in capsys.readouterr().err
    records = transcribed(tmp_path / "out.jsonl")
    assert records["stereo"]["phones"] == records[source.stem]["phones"]   # two equal channels: the same audio
    assert records["mono"]["duration"] == pytest.approx(records[source.stem]["duration"], abs=1e-3)

    if shutil.which("ffmpeg") and shutil.which("ffprobe"):    # a format soundfile does not read: via ffmpeg
        subprocess.run(["ffmpeg", "-v", "error", "-i", str(source), "-c:a", "aac", str(tmp_path / "aac.m4a")],
                       check=True)
        assert main([f"checkpoint={tiny_checkpoint}", str(tmp_path / "aac.m4a"), f"out={tmp_path / 'm4a.jsonl'}"]) == SUCCESS
        record = transcribed(tmp_path / "m4a.jsonl")["aac"]
        assert record["duration"] == pytest.approx(records[source.stem]["duration"], abs=0.05)


def test_resampling_keeps_a_tone_at_its_frequency():
    seconds, tone = 2.0, 440.0
    at_44k = np.sin(2 * np.pi * tone * np.arange(int(44100 * seconds)) / 44100).astype(np.float32)
    at_16k = resample(at_44k, 44100, 16000)
    assert len(at_16k) == int(16000 * seconds)
    expected = np.sin(2 * np.pi * tone * np.arange(len(at_16k)) / 16000)
    middle = slice(1000, -1000)     # away from the filter's edges
    assert np.abs(at_16k[middle] - expected[middle]).max() < 1e-2


# ---- long recordings --------------------------------------------------------------------------------------
def concatenated_test_utterances(tiny_synth: Path, gap_seconds: float, repeat: int) -> tuple[np.ndarray, list]:
    """The test split's utterances one after another (`repeat` times), `gap_seconds` of silence
    (low noise) between them; returns the samples and each gap's (first, last) 10 ms frame."""
    rng = np.random.default_rng(0)
    parts, gaps, position = [], [], 0
    for flac in sorted((tiny_synth / "audio" / "test").glob("*.flac")) * repeat:
        samples, rate = soundfile.read(str(flac), dtype="float32")
        assert rate == 16000
        gap = (1e-4 * rng.standard_normal(int(gap_seconds * rate))).astype(np.float32)
        parts += [samples, gap]
        position += len(samples)
        gaps.append((position // 160, (position + len(gap)) // 160))
        position += len(gap)
    return np.concatenate(parts), gaps[:-1]


def test_long_recordings_are_cut_in_the_pauses(tiny_synth):
    samples, gaps = concatenated_test_utterances(tiny_synth, gap_seconds=0.6, repeat=3)
    num_frames = 1 + (len(samples) - 400) // 160
    longest = max(b - a for a, b in zip([0] + [g[1] for g in gaps], [g[0] for g in gaps] + [num_frames]))
    window, context = int(1.6 * longest) + 40, 20
    pieces = cut_into_pieces(frame_energies(samples, 160), num_frames, window, context, step=2)
    assert len(pieces) > 1
    for piece in pieces:
        assert piece.end - piece.start <= window
        assert piece.start == max(0, piece.keep_start - context) and piece.end == min(num_frames, piece.keep_end + context)
    assert [p.keep_start for p in pieces[1:]] == [p.keep_end for p in pieces[:-1]]       # no gap, no overlap
    assert pieces[0].keep_start == 0 and pieces[-1].keep_end == num_frames
    for piece in pieces[1:]:      # every cut in a pause (between utterances or words): 100 ms below -60 dBFS
        around = samples[(piece.keep_start - 5) * 160:(piece.keep_start + 5) * 160]
        assert np.abs(around).max() < 1e-3, (piece, gaps)
    assert cut_into_pieces(np.zeros(10), 10, 40, 4, 2) == [Piece(0, 10, 0, 10)]
    # noise with silent 200 ms gaps at known places: each cut lies in one of them
    rng = np.random.default_rng(1)
    noise = (0.3 * rng.standard_normal(160 * 3000)).astype(np.float32)
    silent = [(700, 720), (1290, 1310), (1900, 1920), (2500, 2520)]
    for a, b in silent:
        noise[a * 160:b * 160] = 0.0
    pieces = cut_into_pieces(frame_energies(noise, 160), 2998, window=1000, context=50, step=4)
    assert len(pieces) == 5
    for piece in pieces[1:]:
        assert any(a <= piece.keep_start < b for a, b in silent), (piece, silent)


def test_the_pieces_join_into_the_whole_recordings_output(tiny_checkpoint, tiny_synth, tmp_path, monkeypatch):
    """A model whose output at a frame depends on nearby frames only (no attention layer, no
    positions) gives the same frames for a recording cut into pieces as for the whole: the joined
    hypothesis must equal the unwindowed one, frame for frame, for any number of pieces."""
    tokenizers = torch.load(tiny_checkpoint, weights_only=True)["hyper_parameters"]["tokenizers"]
    torch.manual_seed(0)
    model = SpeechRecognizer(model=dict(layers=0, heads=2, head_dim=8, ff_dim=16, dropout=0.0, subsampling=4,
                                        subsampling_channels=4, shared_qk=False),
                             attention={"name": "full"}, optim={}, feature_dim=40, tokenizers=tokenizers).eval()
    for head in model.heads.parameters():     # sharper outputs: many tokens to compare
        head.data.mul_(30)
    monkeypatch.setattr(encoder_module, "sinusoidal_positions", lambda length, width, device=None: torch.zeros(length, width))
    samples, _ = concatenated_test_utterances(tiny_synth, gap_seconds=0.4, repeat=2)
    soundfile.write(str(tmp_path / "long.wav"), samples, 16000, subtype="FLOAT")
    seconds = len(samples) / 16000

    def run(window: float, overlap: float) -> dict:
        config = TranscribeConfig(window=window, overlap=overlap, batch_seconds=max(200.0, window), progress=False)
        outcome = transcribe_files(model, [tmp_path / "long.wav"], config)
        assert not outcome.failures
        return outcome.records[0]

    whole = run(window=seconds + 10, overlap=2.0)
    assert len(whole["phones"]["hypothesis"].split()) > 20
    for window in (seconds / 2.5, seconds / 4):
        assert run(window=window, overlap=1.0) == whole


# ---- one pass (window=none) -------------------------------------------------------------------------------
def test_one_pass_decodes_the_models_output_on_the_whole_recordings_features(tiny_checkpoint, tiny_synth, tmp_path,
                                                                              monkeypatch):
    """window=none: the record is the greedy decoding of the model run by hand on the features of
    the whole file computed at once (the features are computed in blocks: 7 frames here)."""
    import asr.evaluation.transcription as transcription
    from asr.evaluation.evaluation import load_model
    from asr.model.ctc import decode_transcripts
    monkeypatch.setattr(transcription, "FEATURE_BLOCK_FRAMES", 7)
    samples, _ = concatenated_test_utterances(tiny_synth, gap_seconds=0.4, repeat=2)
    soundfile.write(str(tmp_path / "long.wav"), samples, 16000, subtype="FLOAT")
    model = load_model(str(tiny_checkpoint), "cpu")
    outcome = transcribe_files(model, [tmp_path / "long.wav"], TranscribeConfig(window=None, progress=False))
    assert not outcome.failures
    features = model.frontend(samples)
    with torch.no_grad():
        transcription.seed_evaluation_batch(0, 0)
        log_probs, lengths = model(features[None], torch.tensor([len(features)]))
    for kind, tokenizer in model.tokenizers.items():
        expected = decode_transcripts(log_probs[kind], lengths, tokenizer, "greedy", 1)[0]
        assert outcome.records[0][kind]["hypothesis"] == expected


def test_one_pass_estimates_a_long_file_reports_each_layer_and_refuses_what_does_not_fit(
        tiny_checkpoint, tiny_synth, tmp_path, monkeypatch):
    import asr.evaluation.transcription as transcription
    from asr.evaluation.evaluation import load_model
    samples, _ = concatenated_test_utterances(tiny_synth, gap_seconds=0.4, repeat=2)
    soundfile.write(str(tmp_path / "long.wav"), samples, 16000, subtype="FLOAT")
    model = load_model(str(tiny_checkpoint), "cpu")
    monkeypatch.setattr(transcription, "ONE_PASS_CHECK_SECONDS", 1.0)       # "long" from 1 s on
    monkeypatch.setattr(transcription, "CALIBRATION_SECONDS", (1.0, 2.0))
    notes = []
    outcome = transcribe_files(model, [tmp_path / "long.wav"], TranscribeConfig(window=None, progress=False),
                               warn=notes.append)
    assert not outcome.failures and len(outcome.records) == 1
    assert "one pass over" in notes[0] and "full attention: about" in notes[0]
    layers = len(model.encoder.layers)
    assert len(notes) == 1 + layers
    assert all(f"layer {i + 1}/{layers} done" in note for i, note in enumerate(notes[1:]))
    assert not model.encoder.layers[0]._forward_hooks             # removed after the file

    # runs of n frames that take 1 MB per frame, and 1 GB left: refused
    monkeypatch.setattr(transcription, "_timed_run", lambda model, features: (0.01, 1e6 * len(features)))
    monkeypatch.setattr(transcription, "available_memory_bytes", lambda: 1e9)
    notes.clear()
    outcome = transcribe_files(model, [tmp_path / "long.wav"], TranscribeConfig(window=None, progress=False),
                               warn=notes.append)
    reason = outcome.failures[str(tmp_path / "long.wav")]
    frames = 1 + (len(samples) - 400) // 160
    assert f"would need about {frames * 1e6 / 1e9:.1f} GB, more than the 1.0 GB available" in reason
    assert "window=20" in reason and "iclustered-100" in reason
    assert not outcome.records


@pytest.mark.parametrize("quadratic", [False, True])
def test_the_one_pass_estimate_extrapolates_as_the_attentions_cost_grows(quadratic, monkeypatch):
    """Runs whose time is a n + c n^2 (c = 0 for a linear attention) and memory m0 + b n: the
    estimate at a long n is exact."""
    import asr.evaluation.transcription as transcription
    a, c, m0, b = 2e-4, (1e-8 if quadratic else 0.0), 5e6, 3e3
    monkeypatch.setattr(transcription, "_timed_run",
                        lambda model, features: (a * len(features) + c * len(features) ** 2, m0 + b * len(features)))
    monkeypatch.setattr(transcription, "available_memory_bytes", lambda: 8e9)

    class Model:
        frontend = type("Frontend", (), {"frame_shift_ms": 10.0})()
    if not quadratic:   # the linear fit has a constant: a run of n frames takes t0 + a n
        monkeypatch.setattr(transcription, "_timed_run",
                            lambda model, features: (0.5 + a * len(features), m0 + b * len(features)))
    n = 360_000
    estimate = transcription.estimate_one_pass(Model(), torch.zeros(12_000, 40), quadratic, n)
    expected_seconds = a * n + c * n * n if quadratic else 0.5 + a * n
    assert estimate.seconds == pytest.approx(expected_seconds, rel=1e-6)
    assert estimate.peak_bytes == pytest.approx(m0 + b * n, rel=1e-6)
    assert estimate.available_bytes == 8e9


def test_window_none_is_one_pass_and_a_short_window_names_the_alternative(tiny_checkpoint, capsys):
    from asr.transcribe import parse_arguments
    config, _ = parse_arguments([f"checkpoint={tiny_checkpoint}", "a.wav", "window=none"])
    assert config.window is None
    assert main([f"checkpoint={tiny_checkpoint}", "a.wav", "window=0.5"]) == USAGE_ERROR
    assert "window=0.5 must be at least 1 second, or none (one pass)" in capsys.readouterr().err

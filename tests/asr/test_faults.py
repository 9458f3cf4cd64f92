"""The fault suite: kill -9 at chosen points of training, corpus generation, feature caching and the
cross matrix, start again, and check the result equals that of a run nobody killed.

The kill points are reached by waiting for something on disk: a batch recorded by
trainer.record_batches, a meta file of the generator, or the marker file of the test hook
asr.core.fault_injection (ASR_PAUSE_AT), which stops the process at a point a test could not hit by timing.
Each process is started in its own session and killed with its children (os.killpg, SIGKILL).
"""
from __future__ import annotations

import gzip
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch

from tiny_runs import ROOT, TINY, synth_corpus_contents

ENV = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
ENV.pop("ASR_PAUSE_AT", None)
TIMEOUT = 300


def start(module: str, *arguments: str, cwd: Path, pause_at: str | None = None) -> tuple[subprocess.Popen, Path]:
    env = dict(ENV)
    marker = cwd / f"paused-{time.monotonic_ns()}"
    if pause_at:
        env.update(ASR_PAUSE_AT=pause_at, ASR_PAUSE_MARKER=str(marker))
    process = subprocess.Popen([sys.executable, "-m", module, *arguments], cwd=cwd, env=env,
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
    return process, marker


def kill_when(process: subprocess.Popen, ready) -> None:
    """SIGKILL the process and its children as soon as ready() is true; fails if it ended before."""
    deadline = time.monotonic() + TIMEOUT
    while not ready():
        if process.poll() is not None:
            pytest.fail(f"the process ended (status {process.returncode}) before the kill point:\n"
                        + process.stdout.read()[-3000:])
        assert time.monotonic() < deadline, "the kill point was not reached in time"
        time.sleep(0.05)
    os.killpg(process.pid, signal.SIGKILL)
    process.wait(timeout=60)
    assert process.returncode == -signal.SIGKILL


def finish(module: str, *arguments: str, cwd: Path) -> str:
    done = subprocess.run([sys.executable, "-m", module, *arguments], cwd=cwd, env=ENV, capture_output=True,
                          text=True, timeout=TIMEOUT)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    return done.stdout + done.stderr


def copy_corpus(corpus: Path, to: Path) -> Path:
    """The corpus's audio and manifests without its feature cache (so a run computes the features)."""
    shutil.copytree(corpus, to, ignore=shutil.ignore_patterns("features"))
    return to


def recorded_batches(run: Path) -> list[dict]:
    path = run / "batches" / "rank0.jsonl"
    if not path.is_file():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.endswith("}")]


# ---- asr.train ---------------------------------------------------------------------------------------
STEPS = 9   # with 4 batches an epoch (6 utterances, data.max_duration=21): two whole epochs and a batch


def train_arguments(corpus: Path, run: Path) -> list[str]:
    # with waveform augmentation drawn per utterance and epoch: a resumed run must draw what the
    # uninterrupted one drew (speed copies are left out: they would change the batch counts below)
    return ["conf=synth_full", *TINY, f"data.root={corpus}", f"run_dir={run}", "data.specaugment=true",
            "data.augment.reverb_prob=0.5", "data.augment.noise_prob=0.5", "data.augment.channel_prob=0.5",
            "data.augment.volume_prob=0.5", "data.augment.speaker_prob=0.5", "data.augment.vtlp_prob=0.5",
            "data.max_duration=21", "trainer.max_epochs=100", f"trainer.max_steps={STEPS}", "trainer.torch_threads=1",
            "trainer.record_batches=true", "test=false"]


@pytest.fixture(scope="module")
def uninterrupted_run(tiny_synth, tmp_path_factory) -> Path:
    where = tmp_path_factory.mktemp("uninterrupted")
    corpus, run = copy_corpus(tiny_synth, where / "corpus"), where / "run"
    finish("asr.train", *train_arguments(corpus, run), cwd=where)
    return run


def final_weights(run: Path) -> dict[str, torch.Tensor]:
    checkpoint = torch.load(run / "checkpoints" / "last.ckpt", map_location="cpu", weights_only=True)
    assert checkpoint["global_step"] == STEPS
    return checkpoint["state_dict"]


def cached_features(corpus: Path) -> dict[str, np.ndarray]:
    from asr.data.features.feature_cache import FeatureStore
    features = {}
    for split_folder in sorted(corpus.glob("features/*/*/")):
        store = FeatureStore(split_folder, 40)
        features.update({f"{split_folder.name}/{cut_id}": store.load(cut_id) for cut_id in store.index})
    return features


def test_training_killed_three_times_ends_with_the_weights_of_an_uninterrupted_run(uninterrupted_run, tiny_synth,
                                                                                  tmp_path):
    batches = recorded_batches(uninterrupted_run)
    per_epoch = sum(1 for b in batches if b["stage"] == "train" and b["epoch"] == 0)
    assert per_epoch == 4 and STEPS == 2 * per_epoch + 1   # what the kill points below assume
    corpus, run = copy_corpus(tiny_synth, tmp_path / "corpus"), tmp_path / "run"
    arguments = train_arguments(corpus, run)

    # (a) during feature preparation: a shard's frames written, its index not yet
    process, marker = start("asr.train", *arguments, cwd=tmp_path, pause_at="feature_shard_index")
    kill_when(process, marker.exists)
    assert not (run / "checkpoints").exists()
    assert list(corpus.glob("features/*/train/shard-*.lilcom")) and not list(corpus.glob("features/*/train/shard-*.json"))

    # (b) mid-epoch: the second batch of the second epoch has started (the first epoch's checkpoint is on disk)
    process, _ = start("asr.train", *arguments, "ckpt_path=last", cwd=tmp_path)
    kill_when(process, lambda: any(b["stage"] == "train" and b["epoch"] == 1 and b["batch"] == 1
                                   for b in recorded_batches(run)))
    assert torch.load(run / "checkpoints" / "last.ckpt", weights_only=True)["global_step"] == per_epoch

    # (c) during a checkpoint write: the second epoch's checkpoint is whole in its temporary file, not renamed
    process, marker = start("asr.train", *arguments, "ckpt_path=last", cwd=tmp_path, pause_at="checkpoint_replace")
    kill_when(process, marker.exists)
    assert list(run.glob("checkpoints/.*.tmp"))
    assert torch.load(run / "checkpoints" / "last.ckpt", weights_only=True)["global_step"] == per_epoch

    # and to the end
    output = finish("asr.train", *arguments, "ckpt_path=last", cwd=tmp_path)
    assert "resuming from" in output
    assert json.loads((run / "results.json").read_text())["steps"] == STEPS
    assert not list(run.glob("checkpoints/.*.tmp"))
    expected, got = final_weights(uninterrupted_run), final_weights(run)
    assert expected.keys() == got.keys()
    for name in expected:
        assert torch.equal(got[name], expected[name]), name
    # the feature cache the killed runs left is the one an uninterrupted run writes
    expected_features, got_features = cached_features(uninterrupted_run.parent / "corpus"), cached_features(corpus)
    assert sorted(got_features) == sorted(expected_features) and len(got_features) == 8   # train 6, dev 2
    for key in expected_features:
        assert np.array_equal(got_features[key], expected_features[key]), key
    # every training batch after the last kill is the uninterrupted run's batch of that step
    train_ids = [b["ids"] for b in batches if b["stage"] == "train"]
    final_part = [b for b in recorded_batches(run) if b["stage"] == "train"][-(STEPS - per_epoch):]
    assert [b["ids"] for b in final_part] == train_ids[per_epoch:]


# ---- recipes.synth.prepare -------------------------------------------------------------------------
def test_corpus_generation_killed_midway_and_rerun_equals_an_uninterrupted_one(tiny_synth, tmp_path):
    out = tmp_path / "synth"
    arguments = ["--out", str(out), "--train", "6", "--dev", "2", "--test", "2", "--seed", "0", "--jobs", "1",
                 "--no-progress"]
    process, _ = start("recipes.synth.prepare", *arguments, cwd=tmp_path)
    kill_when(process, lambda: len(list(out.glob("meta/train/*.json"))) >= 2)
    assert not (out / "synth_report.json").exists() and not list(out.glob("*.jsonl.gz"))
    finish("recipes.synth.prepare", *arguments, cwd=tmp_path)

    expected, got = synth_corpus_contents(tiny_synth), synth_corpus_contents(out)   # the reports compared too
    assert sorted(got) == sorted(expected)      # no partial file left, none missing
    for name in expected:
        assert got[name] == expected[name], name


# ---- asr.cross_matrix ------------------------------------------------------------------------------
def test_cross_matrix_killed_mid_cell_resumes_without_recomputing_finished_cells(uninterrupted_run, tmp_path):
    checkpoint = uninterrupted_run / "checkpoints" / "last.ckpt"
    out = tmp_path / "matrix"
    arguments = [f"tiny={checkpoint}", "--specs", "full", "clustered-2", "--out", str(out),
                 "--threads", "1"]
    process, marker = start("asr.cross_matrix", *arguments, cwd=tmp_path, pause_at="cross_matrix_cell:2")
    kill_when(process, marker.exists)
    finished = {path.name: path.read_bytes() for path in out.glob("cells/*.json")}
    assert list(finished) == ["tiny__full.json"]
    output = finish("asr.cross_matrix", *arguments, cwd=tmp_path)
    assert "tiny x full: cached" in output and "tiny x clustered-2: PER" in output
    assert (out / "cells" / "tiny__full.json").read_bytes() == finished["tiny__full.json"]   # not recomputed
    matrix = json.loads((out / "matrix.json").read_text())
    assert [row["evaluate_with"] for row in matrix["rows"]] == ["full", "clustered-2"]
    assert all(cell["valid"] for row in matrix["rows"] for cell in row["cells"].values())


# ---- bad audio in a Kaldi folder, through asr.evaluate -----------------------------------------------
def test_evaluating_a_kaldi_folder_with_bad_audio_stops_with_one_message_or_drops_and_counts(
        uninterrupted_run, tmp_path, capsys, caplog):
    import soundfile
    from asr.evaluate import main
    corpus, folder = uninterrupted_run.parent / "corpus", tmp_path / "kaldi"
    folder.mkdir()
    with gzip.open(corpus / "synth_cuts_test.jsonl.gz", "rt") as handle:
        cuts = [json.loads(line) for line in handle]
    wav = [f"{c['id']} {corpus / c['recording']['sources'][0]['source']}\n" for c in cuts]
    text = [f"{c['id']} {c['supervisions'][0]['text'].upper()}\n" for c in cuts]
    rng = np.random.default_rng(0)
    (folder / "empty.wav").write_bytes(b"")
    soundfile.write(folder / "stereo.wav", 0.1 * rng.standard_normal((16000, 2)), 16000)
    soundfile.write(folder / "zero.wav", np.zeros(0), 16000)
    for name in ("empty", "stereo", "zero"):
        wav.append(f"bad-{name} {folder / (name + '.wav')}\n")
        text.append(f"bad-{name} HELLO\n")
    (folder / "wav.scp").write_text("".join(wav))
    (folder / "text").write_text("".join(text))
    arguments = [f"checkpoint={uninterrupted_run / 'checkpoints' / 'best.ckpt'}", f"data_dir={folder}",
                 f"out={tmp_path / 'evaluation'}", "progress=false"]
    assert main(arguments) == 2
    error = capsys.readouterr().err
    assert error.startswith(f"asr.evaluate: error: data_dir='{folder}': kaldi: preparation stopped on 3 problem(s)")
    assert "Traceback" not in error and "give data.skip_bad_audio=true" in error
    for name in ("empty", "stereo", "zero"):
        assert f"bad-{name}: " in error
    assert main([*arguments, "data.skip_bad_audio=true"]) == 0
    # each reason counted and, where the option governs it, named with it
    assert re.search(r"left out 3 utterances \([^;]*\(data\.skip_bad_audio=true\)", caplog.text)
    assert json.loads((tmp_path / "evaluation" / "results.json").read_text())["utterances"] == len(cuts)

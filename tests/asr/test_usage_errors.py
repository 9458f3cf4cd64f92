"""Usage errors that ended in a traceback (exit 1), and messages that named the wrong cause: each is now
one line naming the option, file or folder and what to do (exit 2 for usage errors, 1 for a full disk),
checked before the work it would spoil. One test per probe; README's promise is asr/README.md,
"Exit statuses"."""
from __future__ import annotations

import errno
import gzip
import json
import logging
import os
import shutil
from pathlib import Path

import numpy as np
import pytest
import soundfile

from asr.core.errors import ConfigError, DiskFullError
from asr.core.exit_status import FAILURE, SUCCESS, USAGE_ERROR, run_command
from asr.evaluate import main as evaluate_main
from asr.lexicon import main as lexicon_main
from asr.train import USAGE_ERRORS as TRAIN_USAGE_ERRORS
from asr.training.fit import train
from asr.transcribe import main as transcribe_main
from attention_ext import AttentionConfigError
from tiny_runs import compose_config, tiny_config


@pytest.fixture
def checkpoint(tiny_epochs_run) -> Path:
    return tiny_epochs_run / "checkpoints" / "best.ckpt"


def one_error_line(capsys) -> str:
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1, lines
    return lines[0]


def cuts_of(manifest: Path) -> list[dict]:
    with gzip.open(manifest, "rt") as handle:
        return [json.loads(line) for line in handle]


def write_cuts(manifest: Path, cuts: list[dict]) -> None:
    with gzip.open(manifest, "wt") as handle:
        handle.writelines(json.dumps(cut) + "\n" for cut in cuts)


def corpus_copy(tiny_synth: Path, folder: Path, features: bool = False) -> Path:
    shutil.copytree(tiny_synth, folder, ignore=None if features else shutil.ignore_patterns("features"))
    return folder


def audio_of(cut: dict, root: Path) -> Path:
    source = Path(cut["recording"]["sources"][0]["source"])
    return source if source.is_absolute() else root / source


# ---- asr.train: every numeric option's range, before anything runs ---------------------------------
@pytest.mark.parametrize("override, says", [
    # Lightning's MisconfigurationException, NumPy's ValueError or torch's RuntimeError, with a traceback
    ("trainer.max_steps=-5", "trainer.max_steps=-5 is not allowed: must be >= 1 (or -1 for no limit)"),
    ("trainer.devices=0", 'trainer.devices=0 is not allowed: must be "auto", a number of devices >= 1, or a list'),
    ("trainer.devices=-1", 'trainer.devices=-1 is not allowed: must be "auto"'),
    ("seed=-1", "seed=-1 is not allowed: a seed is a whole number in [0, 4294967295]"),
    ("seed=4294967296", "seed=4294967296 is not allowed: a seed is a whole number in [0, 4294967295]"),
    ("trainer.torch_threads=-3", "trainer.torch_threads=-3 is not allowed: must be a number of threads >= 1"),
    ("trainer.log_every_n_steps=0", "trainer.log_every_n_steps=0 is not allowed: must be >= 1"),
    ("optim.lr=inf", "optim.lr=inf is not allowed: must be a finite number"),
    ("optim.min_lr=-1e-6", "optim.min_lr=-1e-06 is not allowed: must be >= 0"),
    ("synth_corpus.jobs=0", "synth_corpus.jobs=0 is not allowed: must be a number of processes >= 1"),
    ("synth_corpus.train_utterances=-1", "synth_corpus.train_utterances=-1 is not allowed: must be >= 1"),
])
def test_train_refuses_an_out_of_range_number_before_the_run_folder(tiny_synth, tmp_path, override, says):
    with pytest.raises(ConfigError) as refused:
        train(tiny_config(tiny_synth, "conf=synth_full", override), tmp_path / "run")
    assert isinstance(refused.value, TRAIN_USAGE_ERRORS) and str(refused.value).startswith(says)
    assert "\n" not in str(refused.value) and not (tmp_path / "run").exists()


def test_an_adaptation_seed_out_of_range_is_refused():
    from asr.config.schema import validate_config
    with pytest.raises(ConfigError, match=r"^adapt.dev_seed=-2 is not allowed: a seed is a whole number in \[0, "):
        validate_config(compose_config("adapt.dev_seed=-2"))


@pytest.mark.parametrize("override", ["trainer.max_steps=-1", "trainer.max_steps=100", "trainer.devices=auto",
                                      "trainer.devices=1", "trainer.devices=[0,1]", "seed=4294967295",
                                      "trainer.num_sanity_val_steps=-1", "trainer.early_stopping_patience=0"])
def test_the_documented_values_at_the_edges_of_the_ranges_still_pass(override):
    from asr.config.schema import validate_config
    validate_config(compose_config(override))


def test_an_attention_number_of_2_to_the_63_is_one_line_not_a_kernel_cast_error(checkpoint, tmp_path, capsys):
    from asr.config.schema import validate_config
    with pytest.raises(AttentionConfigError, match=r"option clusters=9223372036854775808 is out of range; at most "
                                                   r"2147483647 \(the largest the kernels take\)"):
        validate_config(compose_config("attention=clustered", "attention.clusters=9223372036854775808"))
    # asr.evaluate reached the extension's cluster_queries: "Unable to cast Python instance ... to C++ type"
    assert evaluate_main([f"checkpoint={checkpoint}", "attention=clustered",
                          "attention.clusters=9223372036854775808", f"out={tmp_path / 'e'}"]) == USAGE_ERROR
    assert "option clusters=9223372036854775808 is out of range; at most 2147483647" in one_error_line(capsys)


# ---- asr.evaluate / asr.transcribe -------------------------------------------------------------------
@pytest.mark.parametrize("option, says", [
    ("threads=-3", "threads=-3 must be a number of threads >= 1, or null (torch's default)"),   # torch's RuntimeError
    ("seed=-1", "seed=-1 must be a whole number >= 0 (it seeds clustered and LSH attention)"),
])
def test_evaluate_and_transcribe_refuse_threads_and_seeds_out_of_range(checkpoint, tmp_path, capsys, option, says):
    assert evaluate_main([f"checkpoint={checkpoint}", option, f"out={tmp_path / 'e'}"]) == USAGE_ERROR
    assert one_error_line(capsys) == f"asr.evaluate: error: {says}"
    assert transcribe_main([f"checkpoint={checkpoint}", str(tmp_path), option]) == USAGE_ERROR
    assert one_error_line(capsys) == f"asr.transcribe: error: {says}"
    assert not (tmp_path / "e").exists()


def test_a_nan_duration_in_a_manifest_is_one_line_naming_the_manifest_and_cut(checkpoint, tiny_synth, tmp_path,
                                                                           capsys):
    # "ValueError: cannot convert NaN to integer" from the frame count, with a traceback
    corpus = corpus_copy(tiny_synth, tmp_path / "corpus")
    manifest = corpus / "synth_cuts_test.jsonl.gz"
    cuts = cuts_of(manifest)
    cuts[0]["duration"] = float("nan")
    write_cuts(manifest, cuts)
    assert evaluate_main([f"checkpoint={checkpoint}", f"data.root={corpus}", f"out={tmp_path / 'e'}",
                          "progress=false"]) == USAGE_ERROR
    assert one_error_line(capsys) == (
        f"asr.evaluate: error: {manifest}: the start or duration of these cuts (or of their recordings) is not a "
        f"finite number of seconds >= 0: {cuts[0]['id']}; fix them or regenerate the manifest with its recipe")


def test_a_broken_config_yaml_beside_the_checkpoint_is_one_line_naming_it(checkpoint, tmp_path, capsys):
    # yaml.parser.ParserError with a traceback
    run = tmp_path / "run"
    (run / "checkpoints").mkdir(parents=True)
    shutil.copy(checkpoint, run / "checkpoints" / "best.ckpt")
    (run / "config.yaml").write_text("data: [unclosed\n  x: {")
    assert evaluate_main([f"checkpoint={run / 'checkpoints' / 'best.ckpt'}", f"out={tmp_path / 'e'}"]) == USAGE_ERROR
    line = one_error_line(capsys)
    assert line.startswith(f"asr.evaluate: error: {run / 'config.yaml'} (line 2) is not a readable config (")
    assert "it is the config asr.train wrote beside the checkpoint: restore it" in line
    (run / "config.yaml").write_text("- a list\n- not a config\n")
    assert evaluate_main([f"checkpoint={run / 'checkpoints' / 'best.ckpt'}", f"out={tmp_path / 'e'}"]) == USAGE_ERROR
    assert f"{run / 'config.yaml'} does not hold a config with a data: section" in one_error_line(capsys)


def test_unwritable_outputs_are_refused_before_any_decoding(checkpoint, tiny_synth, tmp_path, capsys, monkeypatch):
    # NotADirectoryError from mkdir / open after (evaluate) or before (transcribe) the work, with a traceback;
    # a path under a file is unwritable for root too (chmod is not, and the tests run as root)
    from asr.evaluation import evaluation
    monkeypatch.setattr(evaluation, "decode_split", lambda *a, **k: pytest.fail("decoded before the check"))
    blocker = tmp_path / "a_file"
    blocker.write_text("")
    assert evaluate_main([f"checkpoint={checkpoint}", f"out={blocker / 'results'}", "progress=false"]) == USAGE_ERROR
    assert one_error_line(capsys) == (f"asr.evaluate: error: out={blocker / 'results'} cannot be written: {blocker} is "
                                      "a file, not a folder; give a folder you can write to with out=FOLDER")
    audio = next((tiny_synth / "audio" / "test").glob("*.flac"))
    assert transcribe_main([f"checkpoint={checkpoint}", str(audio), f"out={blocker / 'out.jsonl'}"]) == USAGE_ERROR
    assert one_error_line(capsys) == (f"asr.transcribe: error: out={blocker / 'out.jsonl'} cannot be written: "
                                      f"{blocker} is a file, not a folder; give a file you can write to")


def test_evaluate_into_an_unwritable_run_folder_stops_before_decoding(checkpoint, tmp_path, capsys, monkeypatch):
    # it decoded everything, then died in write_outputs without printing the rates
    from asr.evaluation import evaluation
    run = tmp_path / "run"
    shutil.copytree(checkpoint.parent.parent, run, ignore=shutil.ignore_patterns("evaluations"))
    (run / "evaluations").write_text("")   # the default results folder's parent cannot be made
    monkeypatch.setattr(evaluation, "decode_split", lambda *a, **k: pytest.fail("decoded before the check"))
    assert evaluate_main([f"checkpoint={run / 'checkpoints' / 'best.ckpt'}", "progress=false"]) == USAGE_ERROR
    line = one_error_line(capsys)
    assert line.startswith(f"asr.evaluate: error: the results folder {run / 'evaluations'}/test_full_greedy")
    assert line.endswith(f"(beside the checkpoint) cannot be written: {run / 'evaluations'} is a file, not a folder; "
                         "give a folder you can write to with out=FOLDER")


def files_under(folder: Path) -> dict[str, int]:
    return {str(path.relative_to(folder)): path.stat().st_mtime_ns for path in folder.rglob("*")}


def test_a_read_only_corpus_whose_features_are_cached_is_evaluated_and_one_lacking_them_refused(
        checkpoint, tiny_synth, tmp_path, capsys, monkeypatch):
    # refused although nothing needed writing; read-only as the checks see it (os.access: root writes anyway)
    corpus = corpus_copy(tiny_synth, tmp_path / "corpus")
    arguments = [f"checkpoint={checkpoint}", f"data.root={corpus}", "progress=false"]
    assert evaluate_main([*arguments, f"out={tmp_path / 'writable'}"]) == SUCCESS   # fills the test split's cache
    capsys.readouterr()
    before = files_under(corpus)
    real_access = os.access
    monkeypatch.setattr(os, "access", lambda path, mode, *a, **k: (
        False if mode & os.W_OK and str(path).startswith(str(corpus)) else real_access(path, mode, *a, **k)))
    assert evaluate_main([*arguments, f"out={tmp_path / 'read_only'}"]) == SUCCESS
    assert json.loads((tmp_path / "read_only" / "results.json").read_text())["error_rates"] == \
        json.loads((tmp_path / "writable" / "results.json").read_text())["error_rates"]
    assert files_under(corpus) == before   # nothing written there

    for shard in (corpus / "features").rglob("test/shard-*"):
        shard.unlink()
    capsys.readouterr()
    assert evaluate_main([*arguments, f"out={tmp_path / 'lacking'}"]) == USAGE_ERROR
    line = one_error_line(capsys)
    assert line.startswith(f"asr.evaluate: error: the feature cache {corpus / 'features'} cannot be written "
                           f"(data.root='{corpus}' is read-only) and lacks the features of 2 utterances of split "
                           "'test'")
    assert "data.cache_dir=FOLDER" in line


def test_a_lexicon_text_word_over_128_kib_is_one_line_not_an_e2big_traceback(tmp_path, capsys):
    # OSError: [Errno 7] Argument list too long: 'espeak-ng'
    text = tmp_path / "words.txt"
    text.write_text("hello\n" + "w" * 140_000 + "\n")
    assert lexicon_main([str(text), "--out", str(tmp_path / "lexicon.txt"), "--no-progress"]) == USAGE_ERROR
    assert one_error_line(capsys) == (f"asr.lexicon: error: {text}: a word of 140000 letters "
                                      f"({'w' * 20}...); a word to pronounce has at most 100 (is it text with its "
                                      "spaces lost?)")
    assert not (tmp_path / "lexicon.txt").exists()


# ---- a full disk --------------------------------------------------------------------------------------
def test_a_checkpoint_written_to_a_full_disk_says_no_space_left_and_names_it(tmp_path, monkeypatch):
    # torch's own message: "[enforce fail at inline_container.cc:672] . unexpected pos 704 vs 598"
    import torch

    from asr.model import checkpoint as checkpoint_module
    real_fdopen = os.fdopen

    def full_device(descriptor, mode="r", *args, **kwargs):   # the temporary file, on a disk with no room
        os.close(descriptor)
        return real_fdopen(os.open("/dev/full", os.O_WRONLY), mode, *args, **kwargs)

    monkeypatch.setattr(checkpoint_module.os, "fdopen", full_device)
    target = tmp_path / "checkpoints" / "last.ckpt"
    with pytest.raises(DiskFullError) as full:
        checkpoint_module.AtomicCheckpointIO().save_checkpoint({"w": torch.zeros(100_000)}, target)
    assert str(full.value) == (f"writing {target} failed: no space left on device; free some space there or "
                               "write elsewhere")
    assert full.value.errno == errno.ENOSPC
    assert not target.exists() and not list(target.parent.iterdir())   # no temporary file left


def test_every_command_reports_a_full_disk_in_one_line_with_exit_1(capsys):
    def write_on_a_full_disk():
        try:
            raise OSError(errno.ENOSPC, "No space left on device", "/runs/x/results.json")
        except OSError:
            raise RuntimeError("[enforce fail at inline_container.cc:672] . unexpected pos 704 vs 598")

    assert run_command("asr.evaluate", write_on_a_full_disk) == FAILURE
    assert one_error_line(capsys) == ("asr.evaluate: error: writing /runs/x/results.json failed: no space left on "
                                      "device; free some space there or write elsewhere")
    with pytest.raises(RuntimeError, match="unrelated"):   # anything else keeps its traceback
        run_command("asr.evaluate", lambda: (_ for _ in ()).throw(RuntimeError("unrelated")))


# ---- messages that named the wrong cause --------------------------------------------------------------
def kaldi_folder_of_test_audio(tiny_synth: Path, folder: Path, texts: list[str] | None = None) -> list[dict]:
    folder.mkdir()
    cuts = cuts_of(tiny_synth / "synth_cuts_test.jsonl.gz")
    texts = texts or [cut["supervisions"][0]["text"].upper() for cut in cuts]
    (folder / "wav.scp").write_text("".join(f"{cut['id']} {audio_of(cut, tiny_synth)}\n" for cut in cuts))
    (folder / "text").write_text("".join(f"{cut['id']} {text}\n" for cut, text in zip(cuts, texts)))
    return cuts


def test_an_empty_transcript_left_out_is_not_blamed_on_skip_bad_audio(checkpoint, tiny_synth, tmp_path, caplog):
    folder = tmp_path / "kaldi"
    cuts = kaldi_folder_of_test_audio(tiny_synth, folder, texts=["HELLO WORLD", ""])
    caplog.set_level(logging.WARNING)
    assert evaluate_main([f"checkpoint={checkpoint}", f"data_dir={folder}", f"out={tmp_path / 'e'}",
                          "progress=false"]) == SUCCESS
    (said,) = [r.getMessage() for r in caplog.records if "left out" in r.getMessage()]
    assert said.startswith(f"data_dir={folder}: left out 1 utterances (1 empty transcript; the list is in ")
    assert "skip_bad_audio" not in said
    assert json.loads((tmp_path / "e" / "results.json").read_text())["utterances"] == len(cuts) - 1


@pytest.mark.parametrize("kind, says", [
    ("folder", "a folder, not an audio file"),
    ("fifo", "not a regular file (a FIFO, device or socket), so not an audio file"),
])
def test_a_folder_or_fifo_where_a_manifest_names_audio_is_called_what_it_is(checkpoint, tiny_synth, tmp_path,
                                                                         capsys, kind, says):
    corpus = corpus_copy(tiny_synth, tmp_path / "corpus")
    cut = cuts_of(corpus / "synth_cuts_test.jsonl.gz")[0]
    audio = audio_of(cut, corpus)
    audio.unlink()
    audio.mkdir() if kind == "folder" else os.mkfifo(audio)
    assert evaluate_main([f"checkpoint={checkpoint}", f"data.root={corpus}", f"out={tmp_path / 'e'}",
                          "progress=false"]) == USAGE_ERROR
    line = one_error_line(capsys)
    assert f"{cut['id']}: {audio}: {says}" in line and "file not found" not in line


@pytest.mark.parametrize("kind", ["folder", "fifo"])
def test_a_folder_or_fifo_where_the_manifest_should_be_is_called_what_it_is(tmp_path, kind):
    from asr.data.corpus.manifests import ManifestError, load_cuts
    manifest = tmp_path / "mine_cuts_test.jsonl.gz"
    manifest.mkdir() if kind == "folder" else os.mkfifo(manifest)   # a FIFO would block the read forever
    what = "a folder" if kind == "folder" else "not a regular file (a FIFO, device or socket)"
    with pytest.raises(ManifestError) as refused:
        load_cuts(tmp_path, "mine", "test", need_phones=False)
    assert str(refused.value) == (f"manifest {manifest} is {what}, not a gzipped JSON-lines file of cuts; move it "
                                  "away and prepare the corpus again, or point data.root at its manifests")


def test_a_stereo_file_in_a_users_kaldi_folder_is_told_how_to_make_it_mono(checkpoint, tiny_synth, tmp_path, capsys):
    folder = tmp_path / "kaldi"
    cuts = kaldi_folder_of_test_audio(tiny_synth, folder)
    samples, rate = soundfile.read(audio_of(cuts[0], tiny_synth), dtype="int16")
    stereo = tmp_path / "stereo.wav"
    soundfile.write(stereo, np.stack([samples, samples], axis=1), rate)
    (folder / "wav.scp").write_text(f"{cuts[0]['id']} {stereo}\n{cuts[1]['id']} {audio_of(cuts[1], tiny_synth)}\n")
    assert evaluate_main([f"checkpoint={checkpoint}", f"data_dir={folder}", f"out={tmp_path / 'e'}",
                          "progress=false"]) == USAGE_ERROR
    said = capsys.readouterr().err   # the preparation's list of problems, one line each
    assert f"{cuts[0]['id']}: {stereo} has 2 channels and nothing names the one to use" in said
    assert "make it mono, e.g. `sox in.wav out.wav remix 1`" in said and "the recipe must name one" not in said


def test_a_bad_feature_jobs_does_not_blame_num_workers():
    from asr.data.config import DataConfig
    with pytest.raises(ValueError) as refused:
        DataConfig(feature_jobs=-3, num_workers=0)
    assert str(refused.value) == "data.feature_jobs=-3 must be a number of processes >= 1"
    with pytest.raises(ValueError, match=r"^data.num_workers=-1 must be a number of DataLoader workers >= 0$"):
        DataConfig(num_workers=-1)
    with pytest.raises(ValueError, match=r"^data.stream_window_shards=0 must be >= 1$"):
        DataConfig(stream_window_shards=0)

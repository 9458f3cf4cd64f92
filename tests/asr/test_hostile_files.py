"""Files and options from someone else: a manifest or a Kaldi folder runs no command unless the user
opts in (data.allow_commands), NaN or infinite audio is an error naming the file, JSON output never
holds NaN, and decoding options that could only give empty hypotheses are refused (SECURITY.md)."""
from __future__ import annotations

import gzip
import json
import logging
import os
import shutil
from pathlib import Path

import numpy as np
import pytest
import soundfile

from asr.core.errors import ConfigError
from asr.core.exit_status import FAILURE, SUCCESS, USAGE_ERROR
from asr.data.corpus.manifests import ManifestError
from asr.evaluate import main as evaluate_main
from asr.evaluation.decoding.lexicon import LexiconFileError, read_lexicon
from asr.prepare_shards import main as prepare_shards_main
from asr.train import USAGE_ERRORS as TRAIN_USAGE_ERRORS
from asr.training.fit import train
from asr.transcribe import main as transcribe_main
from tiny_runs import tiny_config

COMMAND_LOG = "running the audio command"


@pytest.fixture
def checkpoint(tiny_epochs_run) -> Path:
    return tiny_epochs_run / "checkpoints" / "best.ckpt"


def cuts_of(manifest: Path) -> list[dict]:
    with gzip.open(manifest, "rt") as handle:
        return [json.loads(line) for line in handle]


def audio_path(cut: dict, root: Path) -> Path:
    source = Path(cut["recording"]["sources"][0]["source"])
    return source if source.is_absolute() else root / source


def corpus_with_a_command(tiny_synth: Path, folder: Path, split: str, marker: Path) -> tuple[Path, str]:
    """A copy of the tiny corpus whose `split` manifest gets the second cut's audio from a command that
    also creates `marker`; -> (the manifest, the cut's id)."""
    shutil.copytree(tiny_synth, folder, ignore=shutil.ignore_patterns("features"))
    manifest = folder / f"synth_cuts_{split}.jsonl.gz"
    cuts = cuts_of(manifest)
    source = cuts[1]["recording"]["sources"][0]
    source.update(type="command", source=f"touch {marker} && cat {audio_path(cuts[1], folder)}")
    with gzip.open(manifest, "wt") as handle:
        handle.writelines(json.dumps(cut) + "\n" for cut in cuts)
    return manifest, cuts[1]["id"]


def kaldi_folder_with_pipes(tiny_synth: Path, folder: Path, marker: Path) -> None:
    """The tiny corpus's test utterances as a Kaldi folder whose wav.scp reads every file through one
    pipe (`touch marker && cat file |`): the first line is a plain path, the others pipes."""
    folder.mkdir()
    wav, text = [], []
    for number, cut in enumerate(cuts_of(tiny_synth / "synth_cuts_test.jsonl.gz")):
        path = audio_path(cut, tiny_synth)
        wav.append(f"{cut['id']} {path}\n" if number == 0 else f"{cut['id']} touch {marker} && cat {path} |\n")
        text.append(f"{cut['id']} {cut['supervisions'][0]['text'].upper()}\n")
    (folder / "wav.scp").write_text("".join(wav))
    (folder / "text").write_text("".join(text))


def features_computed(corpus: Path) -> list[Path]:
    """The feature shards (eager cache or streaming) under the corpus's feature folder (not its
    options or its empty lock files: asr.core.corpus_lock, asr.data.features.feature_cache)."""
    return [p for p in (corpus / "features").rglob("*")
            if p.is_file() and p.name not in ("options.json", ".corpus.lock", ".readers.lock")]


def one_error_line(capsys) -> str:
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1, lines
    return lines[0]


# ---- a manifest's "command" source -------------------------------------------------------------------
def test_a_manifest_command_stops_training_before_any_work_and_runs_with_the_option(tiny_synth, tmp_path, caplog):
    marker = tmp_path / "ran"
    manifest, cut_id = corpus_with_a_command(tiny_synth, tmp_path / "corpus", "train", marker)
    common = ("conf=synth_full", "test=false", "trainer.max_epochs=1")
    with pytest.raises(ManifestError) as refused:
        train(tiny_config(tmp_path / "corpus", *common), tmp_path / "refused")
    message = str(refused.value)
    assert isinstance(refused.value, TRAIN_USAGE_ERRORS) and "\n" not in message   # one line, exit 2
    assert message.startswith(f"{manifest}: cut {cut_id} gets its audio by running the shell command `touch")
    assert "data.allow_commands=true" in message
    assert not marker.exists() and not features_computed(tmp_path / "corpus")

    caplog.set_level(logging.WARNING)
    result = train(tiny_config(tmp_path / "corpus", *common, "data.allow_commands=true"), tmp_path / "allowed")
    assert marker.exists() and result["steps"] > 0
    shown = [r.getMessage() for r in caplog.records if r.getMessage().startswith(COMMAND_LOG)]
    assert len(shown) == 1 and f"touch {marker} && cat " in shown[0]


def test_evaluate_and_prepare_shards_refuse_a_manifest_command_unless_allowed(checkpoint, tiny_synth, tmp_path,
                                                                             capsys):
    marker = tmp_path / "ran"
    manifest, cut_id = corpus_with_a_command(tiny_synth, tmp_path / "corpus", "test", marker)
    corpus = tmp_path / "corpus"
    assert evaluate_main([f"checkpoint={checkpoint}", f"data.root={corpus}", f"out={tmp_path / 'a'}"]) == USAGE_ERROR
    line = one_error_line(capsys)
    assert f"{manifest}: cut {cut_id}" in line and "data.allow_commands=true" in line
    assert prepare_shards_main([f"root={corpus}", "splits=[test]", "progress=false"]) == USAGE_ERROR
    line = one_error_line(capsys)
    assert f"{manifest}: line 2 (cut {cut_id})" in line and "allow_commands=true" in line
    assert not marker.exists() and not features_computed(corpus)

    assert evaluate_main([f"checkpoint={checkpoint}", f"data.root={corpus}", "data.allow_commands=true",
                          f"out={tmp_path / 'b'}", "progress=false"]) == SUCCESS
    assert marker.exists()
    assert evaluate_main([f"checkpoint={checkpoint}", f"data.root={corpus}", "data.allow_commands=yes please"]) \
        == USAGE_ERROR
    assert "data.allow_commands='yes please'; give true or false" in one_error_line(capsys)


def test_a_noise_manifest_command_is_refused_unless_allowed(tmp_path):
    from lhotse import Recording, RecordingSet

    from asr.data.augment.waveform_augmentation import recordings_of
    wav, marker = tmp_path / "noise.wav", tmp_path / "ran"
    soundfile.write(wav, np.zeros(1600, dtype=np.float32), 16000)
    recording = Recording.from_file(wav)
    source = recording.sources[0]
    commanded = RecordingSet.from_recordings([Recording(
        id="noise", sources=[type(source)(type="command", channels=[0], source=f"touch {marker} && cat {wav}")],
        sampling_rate=16000, num_samples=1600, duration=0.1)])
    commanded.to_file(tmp_path / "noise_recordings.jsonl.gz")
    with pytest.raises(ManifestError, match="recording noise gets its audio by running the shell command"):
        recordings_of(str(tmp_path / "noise_recordings.jsonl.gz"))
    (allowed,) = recordings_of(str(tmp_path / "noise_recordings.jsonl.gz"), allow_commands=True)
    assert np.array_equal(allowed.load_audio(), recording.load_audio()) and marker.exists()


# ---- a Kaldi wav.scp pipe -----------------------------------------------------------------------------
def test_a_wav_scp_pipe_stops_evaluate_and_runs_once_shown_with_the_option(checkpoint, tiny_synth, tmp_path, capsys,
                                                                          caplog):
    marker, folder = tmp_path / "ran", tmp_path / "kaldi"
    kaldi_folder_with_pipes(tiny_synth, folder, marker)
    assert evaluate_main([f"checkpoint={checkpoint}", f"data_dir={folder}", f"out={tmp_path / 'a'}"]) == USAGE_ERROR
    line = one_error_line(capsys)
    assert f"{folder / 'wav.scp'}: line 2 (" in line and f"`touch {marker} && cat " in line
    assert "data.allow_commands=true" in line
    assert not marker.exists() and not (folder / "asr_manifests").exists()

    caplog.set_level(logging.WARNING)
    assert evaluate_main([f"checkpoint={checkpoint}", f"data_dir={folder}", "data.allow_commands=true",
                          f"out={tmp_path / 'b'}", "progress=false"]) == SUCCESS
    assert marker.exists()
    report = json.loads((tmp_path / "b" / "results.json").read_text())
    assert report["utterances"] == len((folder / "text").read_text().splitlines())
    shown = [r.getMessage() for r in caplog.records if r.getMessage().startswith(COMMAND_LOG)]
    pipes = len((folder / "wav.scp").read_text().splitlines()) - 1
    assert len(shown) == len(set(shown)) == pipes   # each distinct command once


def test_a_wav_scp_pipe_stops_adaptation_before_any_work(tiny_synth, checkpoint, tmp_path):
    marker, folder = tmp_path / "ran", tmp_path / "kaldi"
    kaldi_folder_with_pipes(tiny_synth, folder, marker)
    with pytest.raises(ConfigError) as refused:
        train(tiny_config(tiny_synth, "conf=adapt", f"init_from={checkpoint}", f"adapt.data_dir={folder}"),
              tmp_path / "run")
    message = str(refused.value)
    assert "\n" not in message and f"{folder / 'wav.scp'}: line 2 (" in message
    assert "data.allow_commands=true" in message
    assert not marker.exists() and not (folder / "asr_adapt").exists()


def test_read_kaldi_data_dir_keeps_pipes_as_commands_only_when_allowed(tmp_path):
    from asr.data.corpus.kaldi_dir import KaldiDataDirError, read_kaldi_data_dir
    (tmp_path / "wav.scp").write_text("a /audio/a.wav\nb sph2pipe -f wav /audio/b.sph |\n")
    (tmp_path / "text").write_text("a HELLO\nb WORLD\n")
    with pytest.raises(KaldiDataDirError, match=r"wav.scp: line 2 \(b\) gets its audio by running the shell "
                                                r"command `sph2pipe -f wav /audio/b.sph`"):
        read_kaldi_data_dir(tmp_path, require_utt2spk=False)
    allowed = read_kaldi_data_dir(tmp_path, require_utt2spk=False, allow_commands=True)
    assert allowed.recordings["b"].command == "sph2pipe -f wav /audio/b.sph"
    assert allowed.recordings["a"].path == "/audio/a.wav"


# ---- NaN and infinite audio, NaN in JSON ----------------------------------------------------------
def write_float_wav(path: Path, bad: float) -> Path:
    samples = np.sin(np.arange(16000, dtype=np.float32) / 10.0) * 0.1
    samples[4000] = bad
    soundfile.write(path, samples, 16000, subtype="FLOAT")
    return path


@pytest.mark.parametrize("bad", [float("nan"), float("inf")])
def test_nan_or_infinite_samples_are_an_error_naming_the_file_for_features(tmp_path, bad):
    from lhotse import Recording

    from asr.data.features.feature_cache import load_waveform
    path = write_float_wav(tmp_path / "bad.wav", bad)
    cut = Recording.from_file(path).to_cut()
    with pytest.raises(RuntimeError, match=f"the audio of cut {cut.id} \\({path}\\) holds NaN or infinite samples"):
        load_waveform(cut)


def strict_json(line: str):
    def refuse(constant):
        raise ValueError(f"{constant} is not JSON")
    return json.loads(line, parse_constant=refuse)


def test_transcribe_names_a_file_with_nan_samples_and_writes_only_json(checkpoint, tiny_synth, tmp_path, capsys,
                                                                      monkeypatch):
    folder = tmp_path / "audio"
    folder.mkdir()
    nan_file = write_float_wav(folder / "nan.wav", float("nan"))
    shutil.copy(next((tiny_synth / "audio" / "test").glob("*.flac")), folder / "good.flac")
    status = transcribe_main([f"checkpoint={checkpoint}", str(folder), f"out={tmp_path / 'out.jsonl'}"])
    assert status == FAILURE
    assert f"skipped {nan_file}: it holds NaN or infinite samples" in capsys.readouterr().err
    records = {Path(r["file"]).stem: r for r in map(strict_json, (tmp_path / "out.jsonl").read_text().splitlines())}
    assert "error" in records["nan"] and records["good"]["chars"]["hypothesis"] is not None

    # a model whose outputs are not numbers: its confidence is null, the file still JSON
    from asr.evaluation import transcription
    monkeypatch.setattr(transcription, "mean_confidence", lambda log_probs: float("nan"))
    assert transcribe_main([f"checkpoint={checkpoint}", str(folder / "good.flac"),
                            f"out={tmp_path / 'nan_model.jsonl'}"]) == SUCCESS
    (record,) = map(strict_json, (tmp_path / "nan_model.jsonl").read_text().splitlines())
    assert record["chars"]["confidence"] is None and record["phones"]["confidence"] is None


# ---- decoding options that can only give empty hypotheses --------------------------------------------
@pytest.mark.parametrize("option, says", [
    ("lm_weight=nan", "lm_weight=nan must be a finite number"),
    ("lm_weight=inf", "lm_weight=inf must be a finite number"),
    ("word_score=nan", "word_score=nan must be a finite number"),
    ("word_score=-inf", "word_score=-inf must be a finite number"),
    ("beam=0", "beam=0 must be >= 1"),
])
def test_decoding_options_that_give_no_hypothesis_are_refused(checkpoint, tmp_path, capsys, option, says):
    assert evaluate_main([f"checkpoint={checkpoint}", "decoder=lexicon", option, f"out={tmp_path / 'e'}",
                          "progress=false"]) == USAGE_ERROR
    assert one_error_line(capsys) == f"asr.evaluate: error: {says}" + one_error_line_tail(says)
    assert not (tmp_path / "e").exists()
    assert transcribe_main([f"checkpoint={checkpoint}", str(tmp_path), "decoder=lexicon", option]) == USAGE_ERROR
    assert says in one_error_line(capsys)


def one_error_line_tail(says: str) -> str:
    name = says.split("=", 1)[0]
    return {"lm_weight": " (e.g. lm_weight=1.0)", "word_score": " (e.g. word_score=0.0)",
            "beam": " (the lexicon decoder's hypotheses kept per frame)"}[name]


def test_a_lexicon_line_of_100000_phones_is_refused_by_line_not_a_native_crash(checkpoint, tmp_path, capsys):
    # it overflowed the decoder trie's native stack (SIGSEGV, no message) in asr.evaluate and asr.transcribe
    lexicon = tmp_path / "lexicon.txt"
    lexicon.write_text("yes Y EH S\n" + "endless " + " AH" * 100_000 + "\n")
    audio = tmp_path / "one.wav"
    soundfile.write(audio, np.zeros(16000, dtype=np.float32), 16000)
    with pytest.raises(LexiconFileError, match=rf"lexicon file {lexicon}: 1 pronunciations are longer than 1000 phones "
                                               r"\(line 2: 'endless' with 100000 phones\); a line spells one word"):
        read_lexicon(lexicon)
    for main, name in ((evaluate_main, "asr.evaluate"), (transcribe_main, "asr.transcribe")):
        arguments = [f"checkpoint={checkpoint}", "decoder=lexicon", f"lexicon={lexicon}", "lm=none"]
        arguments += ([f"out={tmp_path / 'e'}", "progress=false"] if main is evaluate_main else [str(audio)])
        assert main(arguments) == USAGE_ERROR
        line = one_error_line(capsys)
        assert line.startswith(f"{name}: error: lexicon file {lexicon}: 1 pronunciations are longer than 1000 phones")


def test_transcribe_named_on_a_fifo_says_so_instead_of_waiting_forever(checkpoint, tmp_path, capsys):
    fifo = tmp_path / "speech.wav"
    os.mkfifo(fifo)                 # nothing ever writes to it: opening it for reading would block
    assert transcribe_main([f"checkpoint={checkpoint}", str(fifo)]) == USAGE_ERROR
    assert one_error_line(capsys) == (f"asr.transcribe: error: {fifo} is not a regular file (a FIFO, device or "
                                      "socket); give an audio file or a folder of them")


# ---- a Kaldi folder's bytes and ids -------------------------------------------------------------------
def kaldi_folder(folder: Path, **files: bytes) -> Path:
    """A Kaldi folder of two utterances with plain files, any of which `files` replaces (name -> bytes)."""
    folder.mkdir(exist_ok=True)
    plain = {"wav.scp": b"a /audio/a.wav\nb /audio/b.wav\n", "text": b"a HELLO WORLD\nb GOOD DAY\n",
             "utt2spk": b"a s1\nb s2\n"}
    for name, content in {**plain, **files}.items():
        (folder / name).write_bytes(content)
    return folder


@pytest.mark.parametrize("text, says", [
    (b"a HELLO\xffWORLD\nb GOOD DAY\n",
     r"text:1: byte 8 of the line is not UTF-8 \(b'\\xff'\); save the file as UTF-8"),
    (b"a HELLO WORLD\nb GOOD\x00DAY\n", r"text:2: character 7 of the line is the control character '\\x00'"),
    (b"a HELLO WORLD\nb GOOD\x1b[31mDAY\n", r"text:2: character 7 of the line is the control character '\\x1b'"),
])
def test_a_kaldi_line_with_bad_bytes_or_control_characters_is_an_error_naming_file_and_line(tmp_path, text, says):
    # decoded leniently (errors="replace") or split on any whitespace, they became word breaks in the reference
    from asr.data.corpus.kaldi_dir import KaldiDataDirError, read_kaldi_data_dir
    folder = kaldi_folder(tmp_path / "kaldi", text=text)
    with pytest.raises(KaldiDataDirError, match=f"^{folder / 'text'}:" + says.split(":", 1)[1]):
        read_kaldi_data_dir(folder)


@pytest.mark.parametrize("name, content, key, lines", [
    ("text", b"a HELLO WORLD\nb GOOD DAY\na HELLO\n", "utterance id 'a'", (3, 1)),
    ("wav.scp", b"a /audio/a.wav\nb /audio/b.wav\n\nb /audio/c.wav\n", "recording id 'b'", (4, 2)),
    ("utt2spk", b"a s1\nb s2\nb s3\n", "utterance id 'b'", (3, 2)),
    ("segments", b"a a 0 1\nb b 0 1\na b 1 2\n", "utterance id 'a'", (3, 1)),
])
def test_an_id_given_twice_in_a_kaldi_file_is_an_error_naming_both_lines(tmp_path, name, content, key, lines):
    # the second line silently replaced the first: one utterance fewer, scored against the wrong words
    from asr.data.corpus.kaldi_dir import KaldiDataDirError, read_kaldi_data_dir
    folder = kaldi_folder(tmp_path / "kaldi", **{name: content})
    with pytest.raises(KaldiDataDirError) as refused:
        read_kaldi_data_dir(folder)
    assert str(refused.value) == (f"{folder / name}:{lines[0]}: {key} is also on line {lines[1]}; "
                                  f"each {key.rsplit(' ', 1)[0]} may be given once")


def test_kaldi_files_in_utf8_with_a_byte_order_mark_tabs_and_crlf_still_read(tmp_path):
    from asr.data.corpus.kaldi_dir import read_kaldi_data_dir
    folder = kaldi_folder(tmp_path / "kaldi", text="\ufeffa\tHÉLLO WORLD\r\nb GOOD DAY\r\n".encode(),
                          segments=b"a a 0 1.5\nb b 0.5 2\n")
    read = read_kaldi_data_dir(folder)
    assert [(u.id, u.words, u.start, u.end) for u in read.utterances] == [
        ("a", ("HÉLLO", "WORLD"), 0.0, 1.5), ("b", ("GOOD", "DAY"), 0.5, 2.0)]


def test_a_segment_of_nan_seconds_is_an_error_naming_the_line(tmp_path):
    from asr.data.corpus.kaldi_dir import KaldiDataDirError, read_kaldi_data_dir
    folder = kaldi_folder(tmp_path / "kaldi", segments=b"a a 0 1\nb b nan 2\n")
    with pytest.raises(KaldiDataDirError, match=f"^{folder / 'segments'}:2: start and end must be finite seconds"):
        read_kaldi_data_dir(folder)


def test_evaluate_on_a_kaldi_text_with_a_nul_is_one_line_and_exit_2(checkpoint, tmp_path, capsys):
    folder = kaldi_folder(tmp_path / "kaldi", text=b"a HELLO\x00WORLD\nb GOOD DAY\n")
    assert evaluate_main([f"checkpoint={checkpoint}", f"data_dir={folder}", f"out={tmp_path / 'e'}",
                          "progress=false"]) == USAGE_ERROR
    assert one_error_line(capsys) == (f"asr.evaluate: error: data_dir: {folder / 'text'}:1: character 8 of the line "
                                      "is the control character '\\x00'; a Kaldi table holds printable text only")

"""The Asterisk prompts recipe on a fixture tree in the Debian packages' layout (G.722 files encoded
by ffmpeg from known tones, a gzipped transcript file in the real format), on the installed packages
when they are there, and asr.evaluate preparing the set itself through its registered preparer."""

from __future__ import annotations

import gzip
import hashlib
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import soundfile

import recipes.asterisk.prepare as asterisk
from asr.data.audio.audio_source import AudioSourceError
from asr.data.corpus.manifest_builder import PreparationError
from asr.evaluation.decoding.lexicon import read_lexicon
from corpus_fixtures import flac_samples, read_gz_jsonl, tone
from recipes.asterisk.prepare import AsteriskSetupError, G722File, main, prepare_asterisk
from recipes.asterisk.prompts import read_aloud, read_prompt, read_prompts

PROGRAMS = ("ffmpeg", "espeak-ng", "flite")
needs_programs = pytest.mark.skipif(not all(shutil.which(p) for p in PROGRAMS),
                                    reason="ffmpeg, espeak-ng or flite not installed (bash .ci/install.sh)")

# name -> (transcript text as in core-sounds-en.txt, seconds of audio or None for no audio file)
PROMPTS = {
    "hello-world": ("Hello world.", 2.0),
    "auth-thankyou": ("Thank you.", 2.25),
    "privacy-thankyou": ("Thank you.", 2.5),
    "vm-intro": ("Please leave your message after the tone.  (simple tone sound plays)", 2.75),
    "digits/a-m": ("A.M.", 3.0),
    "vm-Cust1": ("folder 5", 3.25),
    "vm-onefor": ("Press 1 for", 3.5),
    "spy-usbradio": ("USB Radio", 3.75),
    "queue-periodic-announce": ("All of our represenatives are currently busy.", 4.0),
    "beep": ("[this is a simple beep tone]", 0.5),
    "silence/1": ("(1 second of silence)", 0.5),
    "hello": ("Hello.", 0.5),
    "letters/at": ("at [@]", 0.5),
    "dictate/forhelp": ("press 0 for help", 0.5),
    "dictate/both_help": ("press * to toggle pause, press # to enter a new dictation filename", 0.5),
    "spy-iax2": ('IAX (note: does not say "2")', 0.5),
    "pls-try-call-later": ("Please try your call again later.", None),
}
EXTRA_AUDIO = "followme/extra"          # a .g722 file with no transcript line
# What the recipe keeps: id -> (split, text). The split is the documented rule, computed here.
KEPT_TEXT = {
    "hello-world": "hello world", "auth-thankyou": "thank you", "privacy-thankyou": "thank you",
    "vm-intro": "please leave your message after the tone", "digits-a-m": "a m", "vm-Cust1": "folder five",
    "vm-onefor": "press one for", "spy-usbradio": "u s b radio",
    "queue-periodic-announce": "all of our representatives are currently busy",
}
LEFT_OUT = {"no_words": 2, "one_word": 2, "uncertain_number": 1, "uncertain_symbol": 1,
            "uncertain_abbreviation": 1, "no_audio": 1, "no_transcript": 1}
# Phones written out by hand (CMUdict ARPAbet, no stress), as espeak-ng en-us says them.
HAND_PHONES = {
    "hello-world": "HH AH L OW W ER L D",
    "auth-thankyou": "TH AE NG K Y UW",
    "digits-a-m": "EY EH M",
    "vm-Cust1": "F OW L D ER F AY V",
}


def expected_split(text: str) -> str:
    return "dev" if hashlib.sha256(text.encode()).digest()[0] % 2 == 0 else "test"


def encode_g722(samples: np.ndarray, path: Path) -> None:
    """G.722 as the package ships it (raw, 64 kbit/s), encoded by ffmpeg from a 16 kHz WAV."""
    path.parent.mkdir(parents=True, exist_ok=True)
    wav = path.with_suffix(".wav")
    soundfile.write(str(wav), samples, 16000, subtype="PCM_16")
    subprocess.run(["ffmpeg", "-nostdin", "-v", "error", "-y", "-i", str(wav), "-c:a", "g722", "-f", "g722",
                    str(path)], check=True)
    wav.unlink()


def build_packages(root: Path) -> tuple[Path, Path]:
    """The two packages' files under root: (sounds folder, transcript file)."""
    sounds = root / "usr/share/asterisk/sounds/en_US_f_Allison"
    transcripts = root / "usr/share/doc/asterisk-core-sounds-en/core-sounds-en.txt.gz"
    for number, (name, (_, seconds)) in enumerate([*PROMPTS.items(), (EXTRA_AUDIO, ("", 0.5))]):
        if seconds is not None:
            encode_g722(tone(int(seconds * 16000), 200 + 40 * number, seed=number), sounds / f"{name}.g722")
    transcripts.parent.mkdir(parents=True)
    with gzip.open(transcripts, "wt") as handle:
        handle.write("; Core Asterisk Sounds in English\n\n")
        handle.writelines(f"{name}: {text}\n" for name, (text, _) in PROMPTS.items())
    return sounds, transcripts


@pytest.fixture(scope="module")
def packages(tmp_path_factory) -> tuple[Path, Path]:
    if not shutil.which("ffmpeg"):
        pytest.skip("ffmpeg not installed")
    return build_packages(tmp_path_factory.mktemp("debian"))


@pytest.fixture(scope="module")
def prepared(packages, tmp_path_factory) -> tuple[Path, dict]:
    if not all(shutil.which(p) for p in PROGRAMS):
        pytest.skip("ffmpeg, espeak-ng or flite not installed")
    out = tmp_path_factory.mktemp("asterisk")
    return out, prepare_asterisk(out, *packages, jobs=2, progress=False)


# ---- the words: notes, digits, abbreviations, misspellings ---------------------------------------------
@pytest.mark.parametrize("transcript, spoken, reason", [
    ("Press 1 for", "Press one for", None),
    ("press 1 to accept this call, or 2 to reject it", "press one to accept this call, or two to reject it", None),
    ("Please leave your message after the tone. (simple tone sound plays)",
     "Please leave your message after the tone.", None),
    ("A.M.", "A.M.", None),                              # espeak-ng spells dotted initials: text "a m"
    ("USB Radio", "U S B Radio", None),
    ("Use the 7 key for Q, and the 9 key for Z.", "Use the seven key for Q, and the nine key for Z.", None),
    ("3D audio enabled", "three D audio enabled", None),
    ("All of our represenatives are busy.", "All of our representatives are busy.", None),
    ("Un-indentified or witheld and therefore", "Un-identified or withheld and therefore", None),
    ("come straight thru to you", "come straight through to you", None),
    ("... to leave the conference.", "... to leave the conference.", None),
    ("press 0 for help", "", "uncertain_number"),        # zero or oh?
    ("extension 1234 and password 4242", "", "uncertain_number"),
    ("at least a 28.8 kilobit modem", "", "uncertain_number"),
    ("H.323", "", "uncertain_number"),
    ("press * to toggle pause", "", "uncertain_symbol"),
    ("press # to enter", "", "uncertain_symbol"),
    ("visit www.asterisk.org.", "", "uncertain_symbol"),
    ("IAX", "", "uncertain_abbreviation"),               # said "eeks", one syllable
    ('IAX (note: does not say "2")', "", "uncertain_abbreviation"),   # the note goes first: no number left
    ("SIP", "", "uncertain_abbreviation"),
])
def test_how_a_transcript_is_read_aloud(transcript, spoken, reason):
    assert read_aloud(transcript) == (spoken, reason)


@pytest.mark.parametrize("transcript, text, reason", [
    ("A.M.", "a m", None),
    ("USB Radio", "u s b radio", None),
    ("exclaimation-point [!]", "exclamation point", None),
    ("Call-Forward on No Answer.", "call forward on no answer", None),
    ("M I S D N", "m i s d n", None),
    ("[ascending tones]", "", "no_words"),
    ("(10 seconds of silence)", "", "no_words"),
    ("<beep ascending>", "", "no_words"),
    ("Hello.", "hello", "one_word"),
    ("at [@]", "at", "one_word"),
    ("... for ...", "for", "one_word"),
    ("press 0 for help", "", "uncertain_number"),
])
def test_what_a_prompt_becomes(transcript, text, reason):
    prompt = read_prompt("x/y", transcript)
    assert (prompt.text, prompt.left_out, prompt.id) == (text, reason, "x-y")


def test_the_fixture_prompts_are_read_left_out_and_counted(packages):
    prompts, problems, left_out = read_prompts(*packages)
    assert problems == []
    assert {p.id: p.text for p in prompts if p.left_out is None and p.name != "pls-try-call-later"} == KEPT_TEXT
    counts: dict[str, int] = {}
    for problem in left_out:
        counts[problem.kind] = counts.get(problem.kind, 0) + 1
    assert counts == LEFT_OUT
    assert {p.item for p in left_out if p.kind in ("no_audio", "no_transcript")} == {"pls-try-call-later",
                                                                                      EXTRA_AUDIO}


def test_malformed_and_repeated_transcript_lines_are_problems(tmp_path):
    (tmp_path / "sounds").mkdir()
    transcripts = tmp_path / "core-sounds-en.txt"
    transcripts.write_text("hello-world: Hello world.\nno colon here\nhello-world: Hello again.\n")
    _, problems, _ = read_prompts(tmp_path / "sounds", transcripts)
    assert [(p.kind, p.item) for p in problems] == [("bad_transcript", "core-sounds-en.txt:2"),
                                                    ("bad_transcript", "hello-world")]


# ---- the prepared set ------------------------------------------------------------------------------------
@needs_programs
def test_manifests_hold_the_kept_prompts_in_their_splits_with_text_phones_and_durations(prepared, packages):
    out, report = prepared
    sounds, _ = packages
    seen = {}
    for split in ("dev", "test"):
        cuts = read_gz_jsonl(out / f"asterisk_cuts_{split}.jsonl.gz")
        for cut in cuts:
            supervision = cut["supervisions"][0]
            seen[cut["id"]] = split
            assert supervision["text"] == KEPT_TEXT[cut["id"]]
            assert supervision["speaker"] == "allison" and supervision["custom"]["phone_set"] == "arpabet39"
            if cut["id"] in HAND_PHONES:
                assert supervision["custom"]["phones"] == HAND_PHONES[cut["id"]]
            name = next(n for n in PROMPTS if n.replace("/", "-") == cut["id"])
            assert cut["duration"] == PROMPTS[name][1]          # exactly: two samples per G.722 byte
            source = cut["recording"]["sources"][0]["source"]
            assert source == f"audio/{cut['id']}.flac"
            decoded = subprocess.run(["ffmpeg", "-nostdin", "-v", "error", "-f", "g722", "-i",
                                      str(sounds / f"{name}.g722"), "-f", "s16le", "-"],
                                     capture_output=True, check=True).stdout
            np.testing.assert_array_equal(flac_samples(source, out), np.frombuffer(decoded, np.int16))
    assert seen == {cut_id: expected_split(text) for cut_id, text in KEPT_TEXT.items()}
    assert set(seen.values()) == {"dev", "test"}
    assert seen["auth-thankyou"] == seen["privacy-thankyou"]          # the same words: the same split


@needs_programs
def test_the_report_counts_left_out_prompts_by_reason_and_minutes_and_words_per_split(prepared):
    out, report = prepared
    assert report["status"] == "complete" and report["problem_counts"] == LEFT_OUT
    assert report["dropped_utterances"] == sum(LEFT_OUT.values())
    for split in ("dev", "test"):
        ids = [i for i, text in KEPT_TEXT.items() if expected_split(text) == split]
        seconds = sum(PROMPTS[next(n for n in PROMPTS if n.replace("/", "-") == i)][1] for i in ids)
        row = report["splits"][split]
        assert row["utterances"] == len(ids) and row["speakers"] == 1
        assert row["words"] == sum(len(KEPT_TEXT[i].split()) for i in ids)
        assert row["minutes"] == round(seconds / 60, 1)
    assert "train" not in report["splits"]
    assert (out / "asterisk_report.json").is_file()


@needs_programs
def test_the_lexicon_holds_every_word_with_the_synthesisers_pronunciations(prepared):
    out, report = prepared
    lexicon = read_lexicon(out / "lexicon.txt")
    assert set(lexicon) == {word for text in KEPT_TEXT.values() for word in text.split()}
    assert report["lexicon"]["words"] == len(lexicon) and report["lexicon"]["unpronounced_words"] == []
    assert ("HH", "AH", "L", "OW") in lexicon["hello"] and lexicon["m"] == [("EH", "M")]
    assert ("F", "ER") in lexicon["for"] and ("Y", "AH") in lexicon["you"]     # weak forms of function words
    assert lexicon["press"] == [("P", "R", "EH", "S")]                         # no weak form for a content word


@needs_programs
def test_a_rerun_reuses_what_is_complete_and_converts_only_what_is_missing(prepared, packages, tmp_path,
                                                                            monkeypatch):
    out, report = prepared
    audio = sorted((out / "audio").glob("*.flac"))
    stamps = {path.name: path.stat().st_mtime_ns for path in audio}
    # A finished folder is returned as it is: a decoder that would fail is never run.
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "ffmpeg").write_text("#!/bin/sh\nexit 1\n")
    (bin_dir / "ffmpeg").chmod(0o755)
    for program in ("espeak-ng", "flite"):
        os.symlink(shutil.which(program), bin_dir / program)
    with monkeypatch.context() as patch:
        patch.setenv("PATH", str(bin_dir))
        assert prepare_asterisk(out, *packages, progress=False) == report
    # An interrupted run (no report yet, one file missing) converts only that file.
    copy = tmp_path / "copy"
    shutil.copytree(out, copy)
    (copy / "asterisk_report.json").unlink()
    (copy / "audio" / "hello-world.flac").unlink()
    again = prepare_asterisk(copy, *packages, progress=False)
    assert again["splits"] == report["splits"] and again["problem_counts"] == report["problem_counts"]
    for path in sorted((copy / "audio").glob("*.flac")):
        if path.name != "hello-world.flac":
            assert path.stat().st_mtime_ns == stamps[path.name]
    assert not list(copy.rglob("*.partial*"))


# ---- what goes wrong -------------------------------------------------------------------------------------
def test_missing_packages_are_one_line_naming_both(tmp_path, capsys):
    with pytest.raises(AsteriskSetupError) as error:
        prepare_asterisk(tmp_path / "out", tmp_path / "no-sounds", tmp_path / "no-transcripts.txt.gz")
    message = str(error.value)
    assert "asterisk-core-sounds-en-g722 and asterisk-core-sounds-en" in message and "\n" not in message
    assert f"{tmp_path}/no-sounds and {tmp_path}/no-transcripts.txt.gz not found" in message
    assert main(["--out", str(tmp_path / "out"), "--sounds-dir", str(tmp_path / "no-sounds")]) == 1
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("recipes.asterisk.prepare: error: ")
    assert "apt-get install -y --no-install-recommends asterisk-core-sounds-en-g722 asterisk-core-sounds-en" in lines[0]
    assert not (tmp_path / "out").exists()


@needs_programs
def test_missing_programs_are_named_with_their_packages(packages, tmp_path, monkeypatch):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    os.symlink(shutil.which("espeak-ng"), bin_dir / "espeak-ng")
    monkeypatch.setenv("PATH", str(bin_dir))
    with pytest.raises(AsteriskSetupError, match=r"needs ffmpeg, flite, not found on PATH: .*"
                                                 r"apt-get install -y ffmpeg flite`"):
        prepare_asterisk(tmp_path / "out", *packages, progress=False)


@needs_programs
def test_unreadable_audio_stops_with_a_report_or_is_dropped(packages, tmp_path):
    sounds, transcripts = packages
    broken = tmp_path / "sounds"
    shutil.copytree(sounds, broken)
    (broken / "hello-world.g722").write_bytes(b"")               # an empty (truncated) file
    with pytest.raises(PreparationError, match=r"(?s)1 unreadable_audio.*hello-world.g722: no samples.*--bad-data drop"):
        prepare_asterisk(tmp_path / "a", broken, transcripts, progress=False)
    assert not list((tmp_path / "a").glob("asterisk_cuts_*"))
    report = prepare_asterisk(tmp_path / "b", broken, transcripts, bad_data_policy="drop", progress=False)
    assert report["problem_counts"] == {**LEFT_OUT, "unreadable_audio": 1}
    assert report["splits"]["test"]["utterances"] == sum(expected_split(t) == "test" for t in KEPT_TEXT.values()) - 1


@needs_programs
def test_a_decoder_that_gives_another_rate_or_length_is_refused(packages, tmp_path, monkeypatch):
    """A stand-in ffmpeg that decodes at 8 kHz: the rate and the sample count no longer fit the bytes."""
    sounds, _ = packages
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "ffmpeg").write_text(f'#!/bin/bash\nexec {shutil.which("ffmpeg")} "${{@:1:$#-3}}" -ar 8000 -f wav -\n')
    (bin_dir / "ffmpeg").chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    path = sounds / "hello-world.g722"
    with pytest.raises(AudioSourceError, match="decoded to 16000 samples at 8000 Hz; G.722 of 16000 bytes is "
                                               "32000 samples at 16000 Hz"):
        G722File(path=str(path)).load()


# ---- the installed packages --------------------------------------------------------------------------------
@pytest.mark.skipif(not (asterisk.SOUNDS_DIR.is_dir() and asterisk.TRANSCRIPTS.is_file()),
                    reason="asterisk-core-sounds-en-g722 / asterisk-core-sounds-en not installed")
def test_the_installed_packages_give_the_documented_set():
    prompts, problems, left_out = read_prompts(asterisk.SOUNDS_DIR, asterisk.TRANSCRIPTS)
    assert problems == [] and len(prompts) == 569
    counts: dict[str, int] = {}
    for problem in left_out:
        counts[problem.kind] = counts.get(problem.kind, 0) + 1
    assert counts == {"one_word": 232, "no_words": 17, "uncertain_number": 5, "uncertain_symbol": 4,
                      "uncertain_abbreviation": 4, "no_audio": 1}
    unusable = {problem.item for problem in left_out}
    kept = [prompt for prompt in prompts if prompt.name not in unusable]
    splits = {"dev": set(), "test": set()}
    for prompt in kept:
        splits[expected_split(prompt.text)].add(prompt.text)
    assert len(kept) == 306
    assert sum(expected_split(p.text) == "dev" for p in kept) == 149
    assert not splits["dev"] & splits["test"]                       # no sentence in both
    texts = {prompt.name: prompt.text for prompt in kept}
    assert texts["queue-periodic-announce"].startswith("all of our representatives are currently busy")
    assert texts["spy-mgcp"] == "m g c p" and texts["vm-Cust5"] == "folder nine"
    if shutil.which("ffmpeg"):
        path = asterisk.SOUNDS_DIR / "vm-intro.g722"
        samples, rate = G722File(path=str(path)).load()
        assert rate == 16000 and len(samples) == 2 * path.stat().st_size


# ---- asr.evaluate data.corpus=asterisk ---------------------------------------------------------------------
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "asr"))   # the asr tests' tiny-model helpers
from tiny_runs import compose_config, tiny_config  # noqa: E402


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory) -> Path:
    """A tiny synth_full model trained one epoch on the smallest built-in corpus (tests/asr/tiny_runs.py)."""
    if not all(shutil.which(p) for p in (*PROGRAMS, "sox")):
        pytest.skip("ffmpeg, espeak-ng, flite or sox not installed")
    from asr.training.fit import ensure_corpus, train
    corpus = tmp_path_factory.mktemp("synth")
    ensure_corpus(compose_config(f"data.root={corpus}", "synth_corpus.train_utterances=6",
                                 "synth_corpus.dev_utterances=2", "synth_corpus.test_utterances=2",
                                 "synth_corpus.jobs=1"))
    run = tmp_path_factory.mktemp("run")
    train(tiny_config(corpus, "conf=synth_full", "test=false"), run)
    return run / "checkpoints" / "best.ckpt"


def registered_asterisk(monkeypatch, sounds: Path, transcripts: Path) -> None:
    """The asterisk recipe as the project registers it, reading the fixture packages."""
    monkeypatch.setattr(asterisk, "SOUNDS_DIR", sounds)
    monkeypatch.setattr(asterisk, "TRANSCRIPTS", transcripts)


def test_the_asterisk_recipe_has_a_preparer():
    from asr.data.corpus.corpus_recipes import corpus_recipe
    recipe = corpus_recipe("asterisk")
    assert recipe.preparer is not None and recipe.prepare_command == "python -m recipes.asterisk.prepare --out {root}"


@needs_programs
def test_evaluate_with_data_corpus_asterisk_prepares_the_set_in_data_asterisk(tiny_model, packages, tmp_path,
                                                                              monkeypatch):
    from asr.evaluation.evaluation import EvaluateConfig, evaluate
    registered_asterisk(monkeypatch, *packages)
    monkeypatch.chdir(tmp_path)                      # data.root defaults to data/asterisk, relative
    report = evaluate(EvaluateConfig(checkpoint=str(tiny_model), split="test", data={"corpus": "asterisk"},
                                     out=str(tmp_path / "evaluation"), progress=False))
    assert report["data"] == "data/asterisk/asterisk_cuts_test.jsonl.gz"
    assert report["utterances"] == sum(expected_split(t) == "test" for t in KEPT_TEXT.values())
    assert {"per", "wer", "cer"} <= set(report["error_rates"])
    for split in ("dev", "test"):
        assert (tmp_path / "data" / "asterisk" / f"asterisk_cuts_{split}.jsonl.gz").is_file()
    assert (tmp_path / "data" / "asterisk" / "lexicon.txt").is_file()


@needs_programs
def test_evaluate_names_what_to_install_or_prepare_when_it_cannot(tiny_model, tmp_path, monkeypatch, capsys):
    from asr.evaluate import main as evaluate_main
    from asr.evaluation.evaluation import EvaluateConfig, evaluate
    from asr.core.errors import EvaluationError
    registered_asterisk(monkeypatch, tmp_path / "no-sounds", tmp_path / "no-transcripts.txt.gz")
    monkeypatch.chdir(tmp_path)
    with pytest.raises(EvaluationError, match="data.corpus=asterisk: preparing its manifests in data/asterisk "
                                              "failed: .*asterisk-core-sounds-en-g722 and asterisk-core-sounds-en"):
        evaluate(EvaluateConfig(checkpoint=str(tiny_model), data={"corpus": "asterisk"}, progress=False))
    assert evaluate_main([f"checkpoint={tiny_model}", "data.corpus=asterisk", "progress=false"]) == 2
    assert len(capsys.readouterr().err.strip().splitlines()) == 1
    # a corpus without a preparer is looked for in data/<corpus> and named with its recipe
    with pytest.raises(EvaluationError, match=r"data.root='data/timit' does not exist: an evaluation generates no "
                                              r"corpus; its manifests: prepare them with `python -m recipes.timit.prepare "
                                              r"--corpus-dir TIMIT_DIR --out data/timit`"):
        evaluate(EvaluateConfig(checkpoint=str(tiny_model), data={"corpus": "timit"}, progress=False))

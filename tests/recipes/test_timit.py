"""TIMIT recipe on a fixture tree in the LDC layout (TRAIN|TEST/DRn/<speaker>/<sentence>.WAV/.PHN/.WRD/.TXT)."""

from pathlib import Path

import numpy as np
import pytest

from asr.text.phones import TIMIT_61, fold_timit_61_to_39
from corpus_fixtures import flac_samples, read_gz_jsonl, tone, write_sphere_pcm
from recipes.timit.prepare import CORE_TEST_SPEAKERS, DEV_SPEAKERS, main, prepare_timit

# (half, region, speaker, sentence, sentence text, phones, samples)
UTTERANCES = [
    ("TRAIN", "DR1", "FCJF0", "SI1027", "Even then, if she took one step forward he could catch her.",
     "h# iy v ix n dh eh n q ih f sh iy t uh kcl k w ah n s tcl t eh pcl p f ao r w er dcl d h#", 8000),
    ("TRAIN", "DR1", "FCJF0", "SX127", "The emperor had a mean temper.",
     "h# dh iy eh m pcl p axr er hv ae dx ax m iy n tcl t eh m pcl p axr h#", 6400),
    ("TRAIN", "DR1", "FCJF0", "SA1", "She had your dark suit in greasy wash water all year.",
     "h# sh ix hv eh dcl d h#", 4800),
    ("TRAIN", "DR2", "MKLS0", "SX357", "Don't ask me to carry an oily rag like that.",
     "h# d ow n ae s kcl k m iy h#", 5600),
    ("TEST", "DR1", "FAKS0", "SI943", "Pattern-matching is tedious.",
     "h# p ae dx er n m ae tcl ch ix ng ix z t iy dcl d iy ax s epi h#", 7200),
    ("TEST", "DR1", "MDAB0", "SI1039", "He will allow a rare lie.",
     "h# hh iy w ih l ax l aw ax r eh r l ay h#", 4000),
    ("TEST", "DR1", "MDAB0", "SX139", "Critical equipment needs proper maintenance.",
     "pau k r ih dx ih kcl k el ax-h kcl k w ih pcl p m ix n tcl t h#", 5200),
    ("TEST", "DR3", "MCTT0", "SX13", "Not in either standard test set.", "h# n aa tcl t h#", 3200),
]


def build_timit(root: Path) -> dict:
    """Writes the tree; returns {utterance id: int16 samples}."""
    samples = {}
    for number, (half, region, speaker, sentence, text, phones, count) in enumerate(UTTERANCES):
        folder = root / "TIMIT" / half / region / speaker
        audio = tone(count, 200 + 50 * number, seed=number)
        # One file in big-endian byte order: SPHERE allows both.
        write_sphere_pcm(folder / f"{sentence}.WAV", audio, big_endian=(number == 1),
                         extra_fields=[("database_id", "s5", "TIMIT"), ("speaker_id", "s3", speaker[1:4])])
        (folder / f"{sentence}.TXT").write_text(f"0 {count} {text}\n")
        symbols = phones.split()
        bounds = np.linspace(0, count, len(symbols) + 1).astype(int)
        (folder / f"{sentence}.PHN").write_text(
            "".join(f"{bounds[i]} {bounds[i + 1]} {p}\n" for i, p in enumerate(symbols)))
        (folder / f"{sentence}.WRD").write_text(f"0 {count} {text.split()[0].lower()}\n")
        samples[f"{speaker.lower()}_{sentence.lower()}"] = audio
    return samples


def test_speaker_lists_are_the_standard_ones():
    assert len(CORE_TEST_SPEAKERS) == 24 and len(DEV_SPEAKERS) == 50
    assert not CORE_TEST_SPEAKERS & DEV_SPEAKERS
    # The core test set: 2 men and 1 woman from each of the 8 dialect regions.
    assert sum(s.startswith("m") for s in CORE_TEST_SPEAKERS) == 16


def test_lee_hon_folding():
    assert len(TIMIT_61) == 61
    folded = fold_timit_61_to_39("H# Q AO AX-H AXR ZH BCL EPI PAU IX UX HV EL EM EN NX ENG DX")
    assert folded == "SIL AA AH ER SH SIL SIL SIL IH UW HH L M N N NG DX"
    classes = {fold_timit_61_to_39(p) for p in TIMIT_61} - {""}
    assert len(classes) == 39
    with pytest.raises(ValueError, match="'XX' is not a TIMIT phone"):
        fold_timit_61_to_39("AA XX")


def test_prepares_train_dev_core_test(tmp_path):
    samples = build_timit(tmp_path / "corpus")
    out = tmp_path / "out"
    report = prepare_timit(tmp_path / "corpus", out, progress=False)

    expected = {"train": ["fcjf0_si1027", "fcjf0_sx127", "mkls0_sx357"],  # SA1 left out
                "dev": ["faks0_si943"], "test": ["mdab0_si1039", "mdab0_sx139"]}  # mctt0: in neither set
    for split, ids in expected.items():
        cuts = read_gz_jsonl(out / f"timit_cuts_{split}.jsonl.gz")
        assert [c["id"] for c in cuts] == ids
        assert report["splits"][split]["utterances"] == len(ids)
        for name in ("recordings", "supervisions"):
            assert (out / f"timit_{name}_{split}.jsonl.gz").is_file()
        rows = {u[2].lower() + "_" + u[3].lower(): u for u in UTTERANCES}
        for cut in cuts:
            row = rows[cut["id"]]
            supervision = cut["supervisions"][0]
            assert cut["duration"] == pytest.approx(row[6] / 16000, abs=1e-9)
            assert supervision["speaker"] == row[2].lower()
            assert supervision["custom"] == {"phones": row[5].upper(), "phone_set": "timit61"}
            path = cut["recording"]["sources"][0]["source"]
            assert path == f"audio/{cut['id']}.flac"  # converted audio: relative to the manifest folder
            np.testing.assert_array_equal(flac_samples(path, out), samples[cut["id"]])
    texts = {c["id"]: c["supervisions"][0]["text"] for s in expected
             for c in read_gz_jsonl(out / f"timit_cuts_{s}.jsonl.gz")}
    assert texts["fcjf0_si1027"] == "even then if she took one step forward he could catch her"
    assert texts["mkls0_sx357"] == "don't ask me to carry an oily rag like that"
    assert texts["faks0_si943"] == "pattern matching is tedious"
    assert report["splits"]["train"]["hours"] == pytest.approx((8000 + 6400 + 5600) / 16000 / 3600, abs=1e-4)


def test_include_sa_keeps_sa_sentences_in_train(tmp_path):
    build_timit(tmp_path / "corpus")
    report = prepare_timit(tmp_path / "corpus", tmp_path / "out", include_sa=True, progress=False)
    assert report["splits"]["train"]["utterances"] == 4


def test_missing_and_unreadable_audio_stop_with_report_then_resume(tmp_path, monkeypatch, capsys):
    samples = build_timit(tmp_path / "corpus")
    speaker_dir = tmp_path / "corpus" / "TIMIT" / "TRAIN" / "DR1" / "FCJF0"
    (speaker_dir / "SX127.WAV").rename(tmp_path / "SX127.WAV.moved")
    good = (tmp_path / "corpus" / "TIMIT" / "TEST" / "DR1" / "FAKS0" / "SI943.WAV").read_bytes()
    (tmp_path / "corpus" / "TIMIT" / "TEST" / "DR1" / "FAKS0" / "SI943.WAV").write_bytes(b"garbage" * 100)
    out = tmp_path / "out"

    assert main(["--corpus-dir", str(tmp_path / "corpus"), "--out", str(out)]) == 1   # stopped while running
    message = capsys.readouterr().err
    assert "2 problem(s): 1 missing_audio, 1 unreadable_audio" in message
    assert "SX127: no .WAV file" in message and "SI943.WAV" in message
    assert "--bad-data drop" in message and "timit_report.json" in message
    assert not list(out.glob("*.jsonl.gz"))
    import json
    report = json.loads((out / "timit_report.json").read_text())
    assert report["status"] == "failed"
    assert report["problem_counts"] == {"missing_audio": 1, "unreadable_audio": 1}
    converted = sorted(p.name for p in (out / "audio").glob("*.flac"))
    assert converted == ["fcjf0_si1027.flac", "mdab0_si1039.flac", "mdab0_sx139.flac", "mkls0_sx357.flac"]
    stamps = {p.name: p.stat().st_mtime_ns for p in (out / "audio").glob("*.flac")}

    # Fix both files; the re-run converts only those two.
    (tmp_path / "SX127.WAV.moved").rename(speaker_dir / "SX127.WAV")
    (tmp_path / "corpus" / "TIMIT" / "TEST" / "DR1" / "FAKS0" / "SI943.WAV").write_bytes(good)
    from asr.data.audio.audio_source import AudioSource
    loaded = []
    original_load = AudioSource.load
    monkeypatch.setattr(AudioSource, "load", lambda self: loaded.append(self.path) or original_load(self))
    report = prepare_timit(tmp_path / "corpus", out, progress=False)
    assert sorted(Path(p).name for p in loaded) == ["SI943.WAV", "SX127.WAV"]
    assert {n: (out / "audio" / n).stat().st_mtime_ns for n in stamps} == stamps
    assert report["status"] == "complete" and report["splits"]["train"]["utterances"] == 3
    np.testing.assert_array_equal(flac_samples("audio/fcjf0_sx127.flac", out), samples["fcjf0_sx127"])

    # A finished preparation with the same settings is not redone at all.
    loaded.clear()
    assert prepare_timit(tmp_path / "corpus", out, progress=False)["status"] == "complete"
    assert loaded == []


def test_bad_data_drop_leaves_utterances_out_and_counts_them(tmp_path):
    build_timit(tmp_path / "corpus")
    (tmp_path / "corpus" / "TIMIT" / "TRAIN" / "DR1" / "FCJF0" / "SX127.PHN").unlink()
    report = prepare_timit(tmp_path / "corpus", tmp_path / "out", bad_data_policy="drop", progress=False)
    assert report["splits"]["train"]["utterances"] == 2
    assert report["problem_counts"] == {"missing_transcript": 1}
    ids = [c["id"] for c in read_gz_jsonl(tmp_path / "out" / "timit_cuts_train.jsonl.gz")]
    assert ids == ["fcjf0_si1027", "mkls0_sx357"]


def test_not_a_timit_folder(tmp_path, capsys):
    (tmp_path / "empty").mkdir()
    assert main(["--corpus-dir", str(tmp_path / "empty"), "--out", str(tmp_path / "out")]) == 2   # a usage error
    error = capsys.readouterr().err
    assert error.startswith("recipes.timit.prepare: error: ") and "no TIMIT TRAIN and TEST folders found" in error
    assert len(error.strip().splitlines()) == 1 and "Traceback" not in error


def test_a_timit_layout_without_utterances_is_a_usage_error_that_writes_nothing(tmp_path, capsys):
    for half in ("TRAIN", "TEST"):
        (tmp_path / "corpus" / half / "DR1").mkdir(parents=True)
    out = tmp_path / "out"
    assert main(["--corpus-dir", str(tmp_path / "corpus"), "--out", str(out)]) == 2
    error = capsys.readouterr().err
    assert error.startswith("recipes.timit.prepare: error: ") and "no timit utterances found" in error
    assert str(tmp_path / "corpus") in error and "Traceback" not in error
    assert not out.exists() or not any(out.iterdir())

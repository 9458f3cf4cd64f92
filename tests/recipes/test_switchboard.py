"""Switchboard recipe on a fixture tree: two-channel 8 kHz mu-law sw0xxxx.sph + ms98 -trans.text files."""

import json
from pathlib import Path

import numpy as np
import pytest

from corpus_fixtures import flac_samples, read_gz_jsonl, write_sphere_ulaw
from asr.data.audio.audio_source import AudioSource, run_audio_command
from asr.data.corpus.manifest_builder import PreparationError
from asr.data.audio.sphere import read_sphere
from recipes.switchboard.prepare import clean_ms98_tokens, main, prepare_switchboard

SECONDS = 4.0
FREQUENCIES = {"A": 300.0, "B": 500.0}  # one tone per side, to check that the sides are not swapped

# conversation -> side -> ms98 lines (segment id, start, end, words)
TRANSCRIPTS = {
    "2001": {
        "A": [("0.000000", "0.500000", "[silence]"),
              ("0.500000", "1.750000", "hi um [laughter-yeah] i'd like to talk about th[e]- work"),
              ("1.750000", "2.500000", "[noise] [vocalized-noise]"),
              ("2.500000", "4.030000", "okay them_1 [bocket/bucket] -[th]at")],  # ends 30 ms past the audio
        "B": [("0.250000", "1.500000", "<b_aside> sure [laughter] <e_aside> yeah")],
    },
    "2005": {"A": [("1.000000", "2.000000", "uh-huh right")], "B": [("0.000000", "1.000000", "well")]},
    "2010": {"A": [("0.000000", "3.000000", "it's a long story")], "B": [("3.000000", "3.500000", "yes")]},
}
EXPECTED = {  # segment id -> (recording, start, end, text)
    "sw2001A-ms98-a-0002": ("sw02001-A", 0.5, 1.75, "hi um yeah i'd like to talk about work"),
    "sw2001A-ms98-a-0004": ("sw02001-A", 2.5, 4.0, "okay them bucket"),
    "sw2001B-ms98-a-0001": ("sw02001-B", 0.25, 1.5, "sure yeah"),
    "sw2005A-ms98-a-0001": ("sw02005-A", 1.0, 2.0, "uh huh right"),
    "sw2005B-ms98-a-0001": ("sw02005-B", 0.0, 1.0, "well"),
    "sw2010A-ms98-a-0001": ("sw02010-A", 0.0, 3.0, "it's a long story"),
    "sw2010B-ms98-a-0001": ("sw02010-B", 3.0, 3.5, "yes"),
}


def build_switchboard(root: Path) -> dict:
    """LDC97S62 discs + ms98 transcripts; returns {recording id: decoded 8 kHz samples of that side}."""
    sides = {}
    t = np.arange(int(SECONDS * 8000)) / 8000
    for disc, number in (("swb1_d1", "2001"), ("swb1_d1", "2005"), ("swb1_d2", "2010")):
        audio = np.stack([np.round(8000 * np.sin(2 * np.pi * FREQUENCIES[s] * t)) for s in "AB"]).astype(np.int16)
        decoded = write_sphere_ulaw(root / "LDC97S62" / disc / "data" / f"sw0{number}.sph", audio)
        for index, side in enumerate("AB"):
            sides[f"sw0{number}-{side}"] = decoded[index]
            folder = root / "swb_ms98_transcriptions" / number[:2] / number
            folder.mkdir(parents=True, exist_ok=True)
            lines = [f"sw{number}{side}-ms98-a-{i + 1:04d} {s} {e} {w}\n"
                     for i, (s, e, w) in enumerate(TRANSCRIPTS[number][side])]
            (folder / f"sw{number}{side}-ms98-a-trans.text").write_text("".join(lines))
            (folder / f"sw{number}{side}-ms98-a-word.text").write_text("word alignments are not read\n")
    return sides


def test_clean_ms98_tokens():
    tokens = "[silence] [laughter-yes] th[e]- -[th]at ex- [bocket/bucket] them_1 <b_aside> {well} [noise] and"
    assert clean_ms98_tokens(tokens.split()) == ["yes", "bucket", "them", "well", "and"]


def test_mulaw_sphere_decoding_matches_g711():
    import tempfile

    with tempfile.TemporaryDirectory() as folder:
        samples = np.arange(-32768, 32768, 97, dtype=np.int16)
        expected = write_sphere_ulaw(Path(folder) / "x.sph", np.stack([samples, samples[::-1]]))
        decoded, rate = read_sphere(Path(folder) / "x.sph")
        assert rate == 8000
        np.testing.assert_array_equal(decoded, expected)
        # and mu-law is close to the input (its quantisation step is at most 1/16 of the magnitude + 4)
        assert np.all(np.abs(decoded[0].astype(int) - samples) <= np.abs(samples.astype(int)) / 16 + 132)


def test_prepares_side_segments(tmp_path):
    sides = build_switchboard(tmp_path)
    out = tmp_path / "out"
    report = prepare_switchboard(tmp_path / "LDC97S62", out, transcripts_dir=tmp_path / "swb_ms98_transcriptions",
                                 dev_conversations=1, test_conversations=1, progress=False)
    splits = {"dev": "2001", "test": "2005", "train": "2010"}  # sorted conversations: first dev, next test
    for split, number in splits.items():
        cuts = read_gz_jsonl(out / f"switchboard_cuts_{split}.jsonl.gz")
        ids = sorted(u for u in EXPECTED if u.startswith(f"sw{number}"))
        assert [c["id"] for c in cuts] == ids
        for cut in cuts:
            recording_id, start, end, text = EXPECTED[cut["id"]]
            supervision = cut["supervisions"][0]
            assert (cut["recording"]["id"], supervision["speaker"], supervision["text"]) == (recording_id, recording_id, text)
            assert cut["start"] == pytest.approx(start) and cut["duration"] == pytest.approx(end - start)
            assert supervision["start"] == 0 and supervision["duration"] == pytest.approx(end - start)
            assert cut["recording"]["num_samples"] == int(SECONDS * 16000)  # 8 kHz upsampled to 16 kHz
        supervisions = read_gz_jsonl(out / f"switchboard_supervisions_{split}.jsonl.gz")
        assert [s["start"] for s in supervisions] == pytest.approx([EXPECTED[s["id"]][1] for s in supervisions])
    assert report["splits"]["dev"]["utterances"] == 3 and report["splits"]["dev"]["speakers"] == 2
    assert report["problem_counts"] == {}

    # Each side's audio is that channel, upsampled: compare with the side's tone computed at 16 kHz.
    t = np.arange(int(SECONDS * 16000)) / 16000
    for recording_id in ("sw02001-A", "sw02001-B", "sw02010-B"):
        audio = flac_samples(f"audio/{recording_id}.flac", out).astype(float)
        exact = 8000 * np.sin(2 * np.pi * FREQUENCIES[recording_id[-1]] * t)
        assert np.max(np.abs(audio - exact)[200:-200]) < 300  # mu-law step at this level is 256
        # the original 8 kHz samples are the even samples of the 16 kHz signal
        assert np.max(np.abs(audio[::2] - sides[recording_id])[100:-100]) < 200


def test_missing_conversation_audio_then_resume(tmp_path, monkeypatch, capsys):
    build_switchboard(tmp_path)
    moved = tmp_path / "sw02005.sph"
    (tmp_path / "LDC97S62/swb1_d1/data/sw02005.sph").rename(moved)
    arguments = ["--corpus-dir", str(tmp_path / "LDC97S62"), "--transcripts-dir",
                 str(tmp_path / "swb_ms98_transcriptions"), "--out", str(tmp_path / "out"),
                 "--dev-conversations", "1", "--test-conversations", "1", "--no-progress"]
    assert main(arguments) == 1   # stopped on problems in the corpus while running
    error = capsys.readouterr().err
    assert "2 problem(s): 2 missing_audio" in error and "sw02005-A: sw02005.sph not found" in error
    assert json.loads((tmp_path / "out/switchboard_report.json").read_text())["status"] == "failed"
    assert sorted(p.name for p in (tmp_path / "out/audio").glob("*.flac")) == [
        "sw02001-A.flac", "sw02001-B.flac", "sw02010-A.flac", "sw02010-B.flac"]

    moved.rename(tmp_path / "LDC97S62/swb1_d1/data/sw02005.sph")
    loaded = []
    original = AudioSource.load
    monkeypatch.setattr(AudioSource, "load", lambda self: loaded.append(self.channel) or original(self))
    assert main(arguments) == 0
    assert sorted(loaded) == [0, 1]  # only sw02005's two sides were decoded
    assert [c["id"] for c in read_gz_jsonl(tmp_path / "out/switchboard_cuts_test.jsonl.gz")] == [
        "sw2005A-ms98-a-0001", "sw2005B-ms98-a-0001"]


def test_segment_past_the_end_of_its_side(tmp_path):
    build_switchboard(tmp_path)
    path = tmp_path / "swb_ms98_transcriptions/20/2010/sw2010B-ms98-a-trans.text"
    path.write_text("sw2010B-ms98-a-0001 3.000000 9.000000 yes\n")
    with pytest.raises(PreparationError, match=r"sw2010B-ms98-a-0001: segment 3.000-9.000 s is outside recording "
                                                r"sw02010-B \(4.000 s\)"):
        prepare_switchboard(tmp_path / "LDC97S62", tmp_path / "out", transcripts_dir=tmp_path / "swb_ms98_transcriptions",
                            progress=False)


def test_kaldi_sph2pipe_channel_command_without_sph2pipe(tmp_path, monkeypatch):
    """`sph2pipe -f wav -p -c 2 x.sph |` (Kaldi's swbd wav.scp) is emulated when sph2pipe is missing."""
    from asr.data.audio import audio_source

    sides = build_switchboard(tmp_path)
    monkeypatch.setattr(audio_source.shutil, "which", lambda name: None)
    sph = tmp_path / "LDC97S62/swb1_d1/data/sw02001.sph"
    samples, rate = run_audio_command(f"/opt/kaldi/tools/sph2pipe_v2.5/sph2pipe -f wav -p -c 2 {sph}")
    assert rate == 8000
    np.testing.assert_array_equal(samples[0], sides["sw02001-B"])
    with pytest.raises(audio_source.AudioSourceError, match=r"sph2pipe -c 3\) has 2 channel\(s\); channel index 2"):
        AudioSource(command=f"sph2pipe -f wav -p -c 3 {sph}").load()

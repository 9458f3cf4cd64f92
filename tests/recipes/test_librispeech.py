"""LibriSpeech recipe on a fixture tree: <subset>/<speaker>/<chapter>/<speaker>-<chapter>.trans.txt + .flac."""

import json
from pathlib import Path

import numpy as np
import pytest
import soundfile

from corpus_fixtures import flac_samples, read_gz_jsonl, tone
from recipes.librispeech.prepare import main, prepare_librispeech
from asr.data.corpus.manifest_builder import PreparationError

# subset -> {utterance id: (transcript, samples)}
CORPUS = {
    "train-clean-100": {"103-1240-0000": ("CHAPTER ONE MISSUS RACHEL LYNDE IS SURPRISED", 8000),
                        "103-1240-0001": ("MISSUS RACHEL LYNDE LIVED JUST WHERE THE AVONLEA MAIN ROAD DIPPED", 9600),
                        "1034-121119-0000": ("THE BOY'S NAME WAS ANNE", 4800)},
    "train-clean-360": {"100-121669-0000": ("TOM THE PIPER'S SON", 6400)},
    "dev-clean": {"1272-128104-0000": ("MISTER QUILTER IS THE APOSTLE OF THE MIDDLE CLASSES", 7200)},
    "test-clean": {"1089-134686-0000": ("HE HOPED THERE WOULD BE STEW FOR DINNER", 5600)},
    "test-other": {"1688-142285-0000": ("THERE'S IRON THEY SAY IN ALL OUR BLOOD", 4000)},
}


def build_librispeech(root: Path) -> dict:
    samples = {}
    for subset, utterances in CORPUS.items():
        chapters = {}
        for utterance_id, (text, count) in utterances.items():
            speaker, chapter, _ = utterance_id.split("-")
            folder = root / "LibriSpeech" / subset / speaker / chapter
            folder.mkdir(parents=True, exist_ok=True)
            samples[utterance_id] = tone(count, 100 + len(samples) * 37, seed=len(samples))
            soundfile.write(folder / f"{utterance_id}.flac", samples[utterance_id], 16000, subtype="PCM_16")
            chapters.setdefault(folder / f"{speaker}-{chapter}.trans.txt", []).append(f"{utterance_id} {text}\n")
        for path, lines in chapters.items():
            path.write_text("".join(lines))
    return samples


def test_prepares_subsets_referencing_the_original_flac(tmp_path, capsys):
    samples = build_librispeech(tmp_path)
    out = tmp_path / "out"
    assert main(["--corpus-dir", str(tmp_path), "--out", str(out), "--train-subsets", "train-clean-100",
                 "train-clean-360", "--no-progress"]) == 0
    expected = {"train": ["100-121669-0000", "103-1240-0000", "103-1240-0001", "1034-121119-0000"],
                "dev": ["1272-128104-0000"], "test": ["1089-134686-0000"], "test_other": ["1688-142285-0000"]}
    texts = {u: t for subset in CORPUS.values() for u, (t, _) in subset.items()}
    counts = {u: n for subset in CORPUS.values() for u, (_, n) in subset.items()}
    for split, ids in expected.items():
        cuts = read_gz_jsonl(out / f"librispeech_cuts_{split}.jsonl.gz")
        assert [c["id"] for c in cuts] == ids
        for cut in cuts:
            supervision = cut["supervisions"][0]
            assert supervision["text"] == texts[cut["id"]].lower()
            assert supervision["speaker"] == cut["id"].split("-")[0]
            assert cut["duration"] == pytest.approx(counts[cut["id"]] / 16000, abs=1e-9)
            assert "custom" not in supervision or not supervision["custom"]  # no lexicon: no phones
            source = cut["recording"]["sources"][0]["source"]
            assert Path(source).is_absolute() and Path(source).parent.parent.parent.parent.name == "LibriSpeech"
            np.testing.assert_array_equal(flac_samples(source, out), samples[cut["id"]])
    assert not (out / "audio").exists() or not list((out / "audio").iterdir())  # nothing copied
    assert "dev_other" not in json.loads((out / "librispeech_report.json").read_text())["splits"]
    assert "test_other" in capsys.readouterr().out


def test_lexicon_gives_phones_and_reports_oov(tmp_path):
    build_librispeech(tmp_path)
    lexicon = tmp_path / "librispeech-lexicon.txt"
    words = {"HE": "HH IY1", "HOPED": "HH OW1 P T", "THERE": "DH EH1 R", "WOULD": "W UH1 D", "BE": "B IY1",
             "STEW": "S T UW1", "FOR": "F AO1 R", "DINNER": "D IH1 N ER0"}
    lexicon.write_text("".join(f"{w}\t{p}\n" for w, p in words.items()))
    with pytest.raises(PreparationError, match="not in the lexicon: CHAPTER ONE MISSUS"):
        prepare_librispeech(tmp_path, tmp_path / "out", train_subsets=["train-clean-100"], lexicon=lexicon,
                            progress=False)
    report = prepare_librispeech(tmp_path, tmp_path / "out", train_subsets=["train-clean-100"], lexicon=lexicon,
                                 oov_policy="drop", progress=False)
    assert list(report["splits"]) == ["test"]  # every other utterance has a word missing from the lexicon
    cut, = read_gz_jsonl(tmp_path / "out" / "librispeech_cuts_test.jsonl.gz")
    assert cut["supervisions"][0]["custom"] == {
        "phones": "HH IY HH OW P T DH EH R W UH D B IY S T UW F AO R D IH N ER", "phone_set": "arpabet39"}
    assert report["oov_words"]["MISSUS"] == 2


def test_missing_subset_and_missing_flac(tmp_path, capsys):
    build_librispeech(tmp_path)
    assert main(["--corpus-dir", str(tmp_path), "--out", str(tmp_path / "out")]) == 2   # a usage error
    error = capsys.readouterr().err
    assert "['train-other-500'] not found" in error and "--train-subsets" in error

    (tmp_path / "LibriSpeech/train-clean-100/103/1240/103-1240-0001.flac").unlink()
    extra = tmp_path / "LibriSpeech/dev-clean/1272/128104/1272-128104-0009.flac"
    soundfile.write(extra, tone(1600), 16000)
    with pytest.raises(PreparationError, match=r"(?s)1 missing_audio, 1 missing_transcript.*103-1240-0001.flac"):
        prepare_librispeech(tmp_path, tmp_path / "out", train_subsets=["train-clean-100"], progress=False)
    report = prepare_librispeech(tmp_path, tmp_path / "out", train_subsets=["train-clean-100"],
                                 bad_data_policy="drop", progress=False)
    assert report["splits"]["train"]["utterances"] == 2
    assert report["problem_counts"] == {"missing_audio": 1, "missing_transcript": 1}

"""recipes/longform: a fixture corpus whose joined recordings are known sample for sample."""
from __future__ import annotations

import json
import os

import numpy as np
import pytest
import soundfile
from lhotse import CutSet, MonoCut, Recording, SupervisionSegment

from asr.core.exit_status import SUCCESS, USAGE_ERROR
from asr.data.corpus.kaldi_dir import read_kaldi_data_dir
from asr.data.corpus.long_recordings import read_long_recording
from recipes.longform.prepare import LongformError, build_long_recordings, main

RATE = 16000
# (id, samples of its file, (offset, length) of the utterance in it, words, phones)
UTTERANCES = [("a", 8000, (0, 8000), "one two", "W AH N T UW"),
              ("b", 9600, (1600, 4800), "three", "TH R IY"),       # a segment of its recording
              ("c", 11200, (0, 11200), "four five six", "F AO R F AY V S IH K S")]


@pytest.fixture
def corpus(tmp_path):
    """Manifests of corpus 'fx' (split test) over 16-bit WAV files of random samples; returns (root,
    {id: the utterance's int16 samples})."""
    root = tmp_path / "fx"
    (root / "audio").mkdir(parents=True)
    rng = np.random.default_rng(0)
    cuts, expected = [], {}
    for name, size, (offset, length), words, phones in UTTERANCES:
        samples = rng.integers(-20000, 20000, size, dtype=np.int16)
        soundfile.write(str(root / "audio" / f"{name}.wav"), samples, RATE, subtype="PCM_16")
        recording = Recording.from_file(str(root / "audio" / f"{name}.wav"), recording_id=name)
        supervision = SupervisionSegment(f"u{name}", name, offset / RATE, length / RATE, text=words, speaker="s",
                                         custom={"phones": phones, "phone_set": "arpabet39"})
        cuts.append(MonoCut(f"u{name}", offset / RATE, length / RATE, 0, recording=recording,
                            supervisions=[supervision]))
        expected[f"u{name}"] = samples[offset:offset + length]
    CutSet.from_cuts(cuts).to_file(str(root / "fx_cuts_test.jsonl.gz"))
    return root, expected


def joined_plan(minutes: float, pause_samples: int) -> list[tuple[str, int]]:
    """The utterance ids in order and where each begins, by the recipe's rule written out: add
    utterances (going round the split) until the recording is at least `minutes` long."""
    order, position, total = [], 0, 0
    while total < minutes * 60 * RATE:
        name, _, (_, length), _, _ = UTTERANCES[len(order) % len(UTTERANCES)]
        if order:
            position += pause_samples
        order.append((f"u{name}", position))
        position += length
        total = position
    return order


def test_recordings_hold_each_utterance_sample_exact_with_pauses_and_references(corpus, tmp_path):
    root, expected = corpus
    out = tmp_path / "longform"
    # 1.2 s: a, b, c (1.7 s with pauses); 3 s: round the split once more
    rows = build_long_recordings("fx", ("test",), [0.02, 0.05], root, out, pause=0.1, progress=False)
    assert [(r["minutes"], r["utterances"], r["passes"], r["status"]) for r in rows] == \
        [(0.02, 3, 1, "built"), (0.05, 6, 2, "built")]
    for minutes in (0.02, 0.05):
        folder = out / "fx_test" / f"{minutes:g}min"
        plan = joined_plan(minutes, 1600)
        audio, rate = soundfile.read(str(folder / "recording.wav"), dtype="int16")
        assert rate == RATE and soundfile.info(str(folder / "recording.wav")).subtype == "PCM_16"
        last_id, last_start = plan[-1]
        assert len(audio) == last_start + len(expected[last_id])          # utterances + pauses, nothing else
        filled = np.zeros(len(audio), dtype=bool)
        for utterance_id, start in plan:
            assert np.array_equal(audio[start:start + len(expected[utterance_id])], expected[utterance_id])
            filled[start:start + len(expected[utterance_id])] = True
        assert not audio[~filled].any()                                   # the pauses are silence
        recording = read_long_recording(folder)
        assert [(u.source_id, u.start_sample, u.num_samples) for u in recording.utterances] == \
            [(i, s, len(expected[i])) for i, s in plan]
        assert [u.start for u in recording.utterances] == [s / RATE for _, s in plan]
        assert recording.utterances[-1].end == len(audio) / RATE == recording.duration
        words = {f"u{n}": w for n, _, _, w, _ in UTTERANCES}
        phones = {f"u{n}": p for n, _, _, _, p in UTTERANCES}
        assert recording.joined_words() == " ".join(words[i] for i, _ in plan)
        assert recording.joined_phones() == " ".join(phones[i] for i, _ in plan)
        assert recording.phone_set == "arpabet39" and recording.pause_seconds == 0.1
        kaldi = read_kaldi_data_dir(folder)              # what asr.evaluate data_dir= reads
        assert not kaldi.problems and len(kaldi.utterances) == 1
        assert " ".join(kaldi.utterances[0].words) == recording.joined_words()
        source = kaldi.recordings[kaldi.utterances[0].recording_id]
        assert os.path.isabs(source.path) and os.path.samefile(source.path, folder / "recording.wav")
    repeated = read_long_recording(out / "fx_test" / "0.05min")
    assert repeated.passes == 2 and [u.id for u in repeated.utterances] == ["ua", "ub", "uc", "ua#1", "ub#1", "uc#1"]


def test_a_rerun_with_the_same_settings_does_nothing_and_other_settings_rebuild(corpus, tmp_path):
    root, _ = corpus
    out = tmp_path / "longform"
    build_long_recordings("fx", ("test",), [0.02], root, out, pause=0.1, progress=False)
    audio = out / "fx_test" / "0.02min" / "recording.wav"
    before = audio.stat().st_mtime_ns
    rows = build_long_recordings("fx", ("test",), [0.02], root, out, pause=0.1, progress=False)
    assert rows[0]["status"] == "up to date" and audio.stat().st_mtime_ns == before
    rows = build_long_recordings("fx", ("test",), [0.02], root, out, pause=0.2, progress=False, sample_format="float")
    assert rows[0]["status"] == "built"
    recording = read_long_recording(out / "fx_test" / "0.02min")
    samples, _ = soundfile.read(str(audio), dtype="float32")
    assert soundfile.info(str(audio)).subtype == "FLOAT" and recording.utterances[1].start_sample == 8000 + 3200
    assert np.array_equal(samples[:8000] * 32768, soundfile.read(str(root / "audio" / "a.wav"), dtype="int16")[0])


def test_lengths_longer_than_the_split_are_refused_before_anything_is_written(corpus, tmp_path, capsys):
    root, _ = corpus
    out = tmp_path / "longform"
    with pytest.raises(LongformError, match=r"fx test .* holds 0.03 minutes \(3 utterances with their pauses\), "
                                            r"shorter than 0.05 minutes; choose --minutes up to 0.03"):
        build_long_recordings("fx", ("test",), [0.02, 0.05], root, out, pause=0.1, longer_than_split="refuse",
                              progress=False)
    assert not out.exists()
    assert main(["--corpus", "fx", "--root", str(root), "--minutes", "0.05", "--longer-than-split", "refuse",
                 "--out", str(out), "--no-progress"]) == USAGE_ERROR
    assert main(["--corpus", "fx", "--root", str(root), "--split", "dev", "--out", str(out)]) == USAGE_ERROR
    err = capsys.readouterr().err.splitlines()
    assert err[0].startswith("recipes.longform.prepare: error: fx test") and "--longer-than-split repeat" in err[0]
    assert err[1].startswith("recipes.longform.prepare: error: manifest") and "fx_cuts_dev.jsonl.gz not found" in err[1]
    assert main(["--corpus", "fx", "--root", str(root), "--minutes", "0.02", "--out", str(out), "--no-progress"]) \
        == SUCCESS
    assert "| 0.02 | 0.02 min | 2 | 1 | built |" in capsys.readouterr().out   # 0.5 + 0.4 + 0.3 s: 1.2 s
    assert json.loads((out / "fx_test" / "0.02min" / "settings.json").read_text())["longer_than_split"] == "repeat"

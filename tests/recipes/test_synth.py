"""The synthetic corpus: phone mapping, sentence filtering, plans, and a tiny generated corpus."""

import gzip
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import soundfile

from asr.text.phones import ARPABET_39
from asr.text.synthesiser_phonemes import UnmappablePhonemeError, espeak_to_arpabet, flite_to_arpabet
from recipes.synth.plans import SPLITS, UtterancePlan, plan_utterances, split_sentence_pools
from recipes.synth.prepare import generate_corpus, prepare_synth
from recipes.synth.sentences import build_sentence_list, is_speakable, load_sentences, normalise_text
from recipes.synth.synthesis import synthesise_plan
from recipes.synth.voices import HELD_OUT_SPEAKER_IDS, SPEAKERS, SPEAKERS_BY_ID, MissingSynthesiserError

HAVE_SYNTHESISERS = all(shutil.which(p) for p in ("espeak-ng", "flite", "sox"))
needs_synthesisers = pytest.mark.skipif(not HAVE_SYNTHESISERS, reason="espeak-ng, flite or sox not installed "
                                        "(bash .ci/install.sh installs them)")


# ----------------------------------------------------------------------------- phone mapping

# espeak-ng -x --sep=' ' output (phonemes 1 space apart, words 2) -> CMUdict phones without stress
ESPEAK_CASES = [
    ("k 'a t", "K AE T"),                                   # cat
    ("k 'A@", "K AA R"),                                    # car: r-coloured vowel carries its R
    ("s t 'o@ r i", "S T AO R IY"),                         # story: r after o@ is the vowel's own
    ("h '3: r i", "HH ER IY"),                              # hurry (CMUdict HH ER IY)
    ("k 'A@ r-  I z", "K AA R IH Z"),                       # car is: linking r- dropped after A@
    ("f 3 r-  '@", "F ER AH"),                              # for a
    ("h 3:  r 'aI t", "HH ER R AY T"),                      # her right: next word's r is kept
    ("p 'U@ r-  'OI l", "P UH R OY L"),                     # poor oil
    ("'a v @- r I2 dZ", "AE V ER IH JH"),                   # average: @- r is a syllabic r
    ("n 'oU _: _:  w ,e@", "N OW W EH R"),                  # know, where: pause marks dropped
    ("D I2 ;  'E n d", "DH IH EH N D"),                     # the end: ';' is no phone
    ("b 'V ? n-", "B AH T AH N"),                           # button: glottal stop, syllabic n
    ("'eI b @L", "EY B AH L"),                              # able
    ("D @2  k 'a t  s 'a t  O2 n D @2  m 'a t\n", "DH AH K AE T S AE T AO N DH AH M AE T"),
    ("f 'aI3  tS 'i@3 z", "F AY ER CH IH R Z"),             # fire cheers
]


@pytest.mark.parametrize("espeak, expected", ESPEAK_CASES)
def test_espeak_phonemes_map_to_cmudict_phones(espeak, expected):
    assert " ".join(espeak_to_arpabet(espeak)) == expected


def test_flite_segments_map_to_cmudict_phones():
    assert flite_to_arpabet("pau dh ax k ae t s ae t pau\n") == "DH AH K AE T S AE T".split()
    assert flite_to_arpabet("pau hh er r uw m pau") == "HH ER R UW M".split()


@pytest.mark.parametrize("engine, text, foreign", [
    ("espeak", "b 'A: x  I z", "x"),                # Bach
    ("espeak", "m 'O2 n t  b l 'A~ N k", "A~"),     # Mont Blanc
    ("espeak", "(fr) b 'O~ (en)", "(fr)"),          # language switch
    ("flite", "pau b aa xx pau", "xx"),
])
def test_foreign_phonemes_are_reported(engine, text, foreign):
    convert = espeak_to_arpabet if engine == "espeak" else flite_to_arpabet
    with pytest.raises(UnmappablePhonemeError) as error:
        convert(text)
    assert error.value.phoneme == foreign
    assert repr(foreign) in str(error.value)


def _espeak_phones(words: str, voice: str = "en-us") -> str:
    output = subprocess.run(["espeak-ng", "-q", "-x", "--sep= ", "-v", voice, words],
                            capture_output=True, text=True, check=True).stdout
    return " ".join(espeak_to_arpabet(output))


def _flite_phones(words: str) -> str:
    output = subprocess.run(["flite", "-voice", "slt", "-ps", "-t", words, "none"], capture_output=True, text=True, check=True).stdout
    return " ".join(flite_to_arpabet(output))


@needs_synthesisers
@pytest.mark.parametrize("words, expected", [
    ("cat", "K AE T"), ("car", "K AA R"), ("story", "S T AO R IY"), ("her room", "HH ER R UW M"),
    ("the poor oil boy", "DH AH P UH R OY L B OY"), ("mother", "M AH DH ER"),
])
def test_espeak_says_known_words_with_cmudict_phones(words, expected):
    assert _espeak_phones(words) == expected
    assert _espeak_phones(words, "en-us-nyc") == expected


@needs_synthesisers
@pytest.mark.parametrize("words, expected", [
    ("cat", "K AE T"), ("the car", "DH AH K AA R"), ("story", "S T AO R IY"), ("mother", "M AH DH ER"),
])
def test_flite_says_known_words_with_cmudict_phones(words, expected):
    assert _flite_phones(words) == expected


# ----------------------------------------------------------------------------- sentences

def test_sentence_filter():
    assert is_speakable("the children went to the playground.")
    assert is_speakable("Her well-known story wasn't long.")
    assert not is_speakable("a big dog")                       # 3 words
    assert not is_speakable("he paid 50 dollars for the coat")  # digits are read as number words
    assert not is_speakable("the NATO summit was held in spring")  # acronym is spelled out
    assert not is_speakable("a prissy creature...settles into a mold")
    assert not is_speakable("`It's funny about that bar,' he said")
    assert normalise_text("Her well-known story, wasn't it?") == "her well known story wasn't it"


def test_shipped_sentence_list_is_filtered_and_licensed():
    sentences = load_sentences()
    assert 30000 < len(sentences) < 36000
    assert all(is_speakable(s) and s[-1] in ".!?" for s in sentences[::50])
    assert len({normalise_text(s) for s in sentences}) == len(sentences)
    assert "WordNet 3.0 Copyright 2006 by Princeton University" in \
        (Path(__file__).parents[2] / "recipes/synth/LICENSE.wordnet").read_text()


@pytest.mark.skipif(not Path("/usr/share/wordnet/data.noun").is_file(),
                    reason="Debian package wordnet-base not installed (.ci/install.sh installs it)")
def test_sentence_list_rebuilds_identically():
    assert build_sentence_list("/usr/share/wordnet") == load_sentences()


# ----------------------------------------------------------------------------- plans

def test_default_plan_splits_sentences_and_speakers():
    sentences = load_sentences()
    plans = plan_utterances(sentences, seed=0, counts={"train": 3000, "dev": 200, "test": 200})
    used = {split: {s for p in plans[split] for s in p.sentences} for split in SPLITS}
    assert not used["train"] & used["dev"] and not used["train"] & used["test"] and not used["dev"] & used["test"]
    pools = split_sentence_pools(sentences, seed=0)
    assert sum(len(p) for p in pools.values()) == len(sentences)
    assert set().union(*pools.values()) == set(sentences)

    speakers = {split: {p.speaker for p in plans[split]} for split in SPLITS}
    held_out = set(HELD_OUT_SPEAKER_IDS)
    assert not speakers["train"] & held_out and not speakers["dev"] & held_out
    assert speakers["test"] & held_out == held_out
    assert speakers["test"] - held_out  # test also has seen speakers
    assert speakers["train"] == {s.id for s in SPEAKERS} - held_out

    for split in SPLITS:
        for plan in plans[split]:
            words = len(normalise_text(plan.text).split())
            assert 2 <= len(plan.sentences) <= 4 and words >= 8
        mean_words = np.mean([len(normalise_text(p.text).split()) for p in plans[split]])
        assert 18 <= mean_words <= 26  # ~ 6-9 s at 140-200 words per minute
    assert [p.id for p in plans["dev"][:2]] == ["synth-dev-000000", "synth-dev-000001"]


def test_plans_depend_on_seed_only():
    sentences = load_sentences()
    small = plan_utterances(sentences, seed=3, counts={"train": 5, "dev": 2, "test": 2})
    large = plan_utterances(sentences, seed=3, counts={"train": 50, "dev": 2, "test": 2})
    assert small["train"] == large["train"][:5]  # growing a split keeps the utterances there are
    other = plan_utterances(sentences, seed=4, counts={"train": 5, "dev": 2, "test": 2})
    assert [p.sentences for p in other["train"]] != [p.sentences for p in small["train"]]


def test_utterance_scale_doubles_sentences_and_words_and_keeps_speakers():
    """Scale K draws K x 2-4 sentences up to a target of K x 14-30 words; the speaker and voicing
    of utterance i are drawn before the sentences, so they are the same at every scale."""
    sentences = load_sentences()
    counts = {"train": 200, "dev": 0, "test": 0}
    single = plan_utterances(sentences, seed=3, counts=counts)["train"]
    double = plan_utterances(sentences, seed=3, counts=counts, utterance_scale=2)["train"]
    assert [p.speaker for p in double] == [p.speaker for p in single]
    for plans, scale in ((single, 1), (double, 2)):
        sentence_counts = [len(p.sentences) for p in plans]
        assert 2 * scale <= min(sentence_counts) and max(sentence_counts) <= 4 * scale
        for plan in plans:   # stops adding sentences once the target (at most 30 K words) is reached
            words = [len(normalise_text(s).split()) for s in plan.sentences]
            assert len(plan.sentences) == 2 * scale or sum(words[:-1]) < 30 * scale
    mean_words = [sum(len(normalise_text(p.text).split()) for p in plans) / len(plans) for plans in (single, double)]
    assert 1.8 < mean_words[1] / mean_words[0] < 2.2


def test_utterance_scale_is_part_of_the_folder_config(tmp_path):
    from recipes.synth.prepare import _check_config
    _check_config(tmp_path, 0, ["a b c"], utterance_scale=2)
    with pytest.raises(ValueError, match="utterance_scale: 2 there, None now"):
        _check_config(tmp_path, 0, ["a b c"], utterance_scale=1)
    with pytest.raises(ValueError, match="utterance scale must be an integer from 1 to 4"):
        generate_corpus(tmp_path / "other", {"train": 1}, utterance_scale=0)


# ----------------------------------------------------------------------------- a tiny corpus

# Sentences that espeak-ng says with a foreign phoneme (x), next to ordinary ones.
FOREIGN_SENTENCES = ["Bach wrote this fugue for the organ.", "we listened to Bach all evening."]


def _tiny_sentences():
    return load_sentences()[1000:1020] + FOREIGN_SENTENCES * 5


TINY_COUNTS = {"train": 5, "dev": 2, "test": 4}


@pytest.fixture(scope="module")
def tiny_corpora(tmp_path_factory):
    if not HAVE_SYNTHESISERS:
        pytest.skip("espeak-ng, flite or sox not installed")
    root = tmp_path_factory.mktemp("synth")
    reports = {}
    for jobs in (1, 2):
        reports[jobs] = generate_corpus(root / f"jobs{jobs}", TINY_COUNTS, seed=7, jobs=jobs, progress=False,
                                        sentences=_tiny_sentences())
    return root, reports


def _read_cuts(folder, split):
    with gzip.open(folder / f"synth_cuts_{split}.jsonl.gz", "rt") as lines:
        return [json.loads(line) for line in lines]


@needs_synthesisers
def test_manifests_hold_requested_utterances_with_targets(tiny_corpora):
    root, reports = tiny_corpora
    folder = root / "jobs1"
    for split in SPLITS:
        cuts = _read_cuts(folder, split)
        assert len(cuts) == TINY_COUNTS[split] == reports[1]["splits"][split]["utterances"]
        for cut in cuts:
            assert cut["type"] == "MonoCut" and len(cut["supervisions"]) == 1
            supervision = cut["supervisions"][0]
            assert supervision["id"] == cut["id"] and supervision["speaker"] in SPEAKERS_BY_ID
            assert supervision["text"] == " ".join(supervision["text"].split())
            assert set(supervision["text"]) <= set("abcdefghijklmnopqrstuvwxyz' ")
            phones = supervision["custom"]["phones"].split()
            assert set(phones) <= set(ARPABET_39)
            assert 2 <= len(phones) / len(supervision["text"].split()) <= 6


@needs_synthesisers
def test_audio_is_16khz_and_as_long_as_the_manifest_says(tiny_corpora):
    root, _ = tiny_corpora
    folder = root / "jobs1"
    for split in SPLITS:
        for cut in _read_cuts(folder, split):
            recording = cut["recording"]
            path = folder / recording["sources"][0]["source"]  # relative to the corpus folder
            samples, rate = soundfile.read(path, dtype="float32")
            assert rate == recording["sampling_rate"] == 16000 and samples.ndim == 1
            assert len(samples) == recording["num_samples"]
            assert cut["duration"] == pytest.approx(len(samples) / 16000)
            words = len(cut["supervisions"][0]["text"].split())
            assert 1.0 < cut["duration"] < 30.0
            assert 0.15 < cut["duration"] / words < 0.8  # 140-200 words per minute plus pauses
            assert 0.01 < np.sqrt(np.mean(samples ** 2)) and np.abs(samples).max() <= 1.0


@needs_synthesisers
def test_phones_are_what_the_synthesiser_said_for_the_text(tiny_corpora):
    root, _ = tiny_corpora
    for meta in sorted((root / "jobs1" / "meta").glob("*/*.json")):
        record = json.loads(meta.read_text())
        if "dropped" in record or record["engine"] != "espeak-ng":
            continue
        language = record["voice"].split("+")[0]
        assert record["phones"] == _espeak_phones(" ".join(record["sentences"]), language)
        break
    else:
        pytest.fail("no espeak-ng utterance in the tiny corpus")


@needs_synthesisers
def test_same_seed_gives_same_corpus_for_any_number_of_jobs(tiny_corpora):
    root, _ = tiny_corpora
    for split in SPLITS:
        one, two = _read_cuts(root / "jobs1", split), _read_cuts(root / "jobs2", split)
        assert [c["id"] for c in one] == [c["id"] for c in two]
        assert [c["supervisions"] for c in one] == [c["supervisions"] for c in two]
        for a, b in zip(one, two):
            samples_a, _ = soundfile.read(root / "jobs1" / a["recording"]["sources"][0]["source"], dtype="int16")
            samples_b, _ = soundfile.read(root / "jobs2" / b["recording"]["sources"][0]["source"], dtype="int16")
            np.testing.assert_array_equal(samples_a, samples_b)


@needs_synthesisers
def test_utterances_with_foreign_phonemes_are_dropped_and_counted(tiny_corpora):
    root, reports = tiny_corpora
    folder = root / "jobs1"
    records = [json.loads(p.read_text()) for p in (folder / "meta").glob("*/*.json")]
    dropped = [r for r in records if "dropped" in r]
    assert dropped, "the Bach sentences should have made espeak-ng drop some utterances"
    for record in dropped:
        assert record["engine"] == "espeak-ng" and record["phoneme"] == "x"
        assert any("Bach" in s for s in record["sentences"])
        assert not (folder / "audio" / record["split"] / f"{record['id']}.flac").exists()
    kept_ids = {c["id"] for split in SPLITS for c in _read_cuts(folder, split)}
    assert not kept_ids & {r["id"] for r in dropped}
    for split in SPLITS:
        in_split = [r for r in dropped if r["split"] == split]
        numbers = reports[1]["splits"][split]
        assert numbers["dropped"] == len(in_split)
        assert sorted(numbers["dropped_ids"]) == sorted(r["id"] for r in in_split)
        if in_split:
            assert numbers["dropped_by_reason"] == {"unmappable espeak-ng phoneme 'x'": len(in_split)}


@needs_synthesisers
def test_test_split_has_held_out_speakers(tiny_corpora):
    root, reports = tiny_corpora
    speakers = {split: {c["supervisions"][0]["speaker"] for c in _read_cuts(root / "jobs1", split)}
                for split in SPLITS}
    assert not (speakers["train"] | speakers["dev"]) & set(HELD_OUT_SPEAKER_IDS)
    assert reports[1]["splits"]["test"]["held_out_speaker_utterances"] == \
        sum(c["supervisions"][0]["speaker"] in HELD_OUT_SPEAKER_IDS for c in _read_cuts(root / "jobs1", "test"))


@needs_synthesisers
def test_complete_corpus_is_not_regenerated_and_interrupted_one_resumes(tiny_corpora, tmp_path, monkeypatch):
    root, reports = tiny_corpora
    folder = tmp_path / "copy"
    shutil.copytree(root / "jobs1", folder)
    # Complete: returned as it is, without running any synthesiser (there is none on PATH).
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    assert generate_corpus(folder, TINY_COUNTS, seed=7, jobs=1, progress=False,
                           sentences=_tiny_sentences()) == reports[1]
    monkeypatch.undo()

    # Interrupted: no report, manifests and one utterance missing. Only that one is synthesised.
    (folder / "synth_report.json").unlink()
    (folder / "synth_cuts_train.jsonl.gz").unlink()
    victim = _read_cuts(root / "jobs1", "train")[2]["id"]
    (folder / "meta" / "train" / f"{victim}.json").unlink()
    (folder / "audio" / "train" / f"{victim}.flac").unlink()
    before = {p: p.stat().st_mtime_ns for p in (folder / "audio").glob("*/*.flac")}
    report = generate_corpus(folder, TINY_COUNTS, seed=7, jobs=1, progress=False, sentences=_tiny_sentences())
    assert report["splits"] == reports[1]["splits"]
    assert all(p.stat().st_mtime_ns == mtime for p, mtime in before.items())
    again, _ = soundfile.read(folder / "audio" / "train" / f"{victim}.flac", dtype="int16")
    original, _ = soundfile.read(root / "jobs1" / "audio" / "train" / f"{victim}.flac", dtype="int16")
    np.testing.assert_array_equal(again, original)
    assert _read_cuts(folder, "train") == _read_cuts(root / "jobs1", "train")

    with pytest.raises(ValueError, match="seed: 7 there, 8 now"):
        generate_corpus(folder, TINY_COUNTS, seed=8, jobs=1, progress=False, sentences=_tiny_sentences())


@needs_synthesisers
def test_foreign_phoneme_plan_leaves_no_audio(tmp_path):
    plan = UtterancePlan(id="synth-train-000000", split="train", index=0, sentences=tuple(FOREIGN_SENTENCES),
                         speaker="espeak-en-us-default", prosody={"rate_wpm": 175, "pitch": 50}, gain_db=0.0)
    record = synthesise_plan(tmp_path, plan)
    assert record["dropped"] == "unmappable espeak-ng phoneme" and record["phoneme"] == "x"
    assert not list((tmp_path / "audio").glob("**/*.*"))


# ----------------------------------------------------------------------------- missing programs

def test_missing_synthesisers_give_one_clear_message(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path))  # nothing to run there
    with pytest.raises(MissingSynthesiserError) as error:
        prepare_synth(tmp_path / "out", 2, 1, 1, jobs=1, progress=False)
    message = str(error.value)
    assert "espeak-ng, flite, sox" in message and "apt-get install -y espeak-ng flite sox" in message
    assert ".ci/install.sh" in message


@needs_synthesisers
def test_one_missing_synthesiser_is_named(tmp_path, monkeypatch):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for program in ("espeak-ng", "sox"):
        os.symlink(shutil.which(program), bin_dir / program)
    monkeypatch.setenv("PATH", str(bin_dir))
    with pytest.raises(MissingSynthesiserError, match=r"program\(s\) flite, not found.*apt-get install -y flite`"):
        prepare_synth(tmp_path / "out", 2, 1, 1, jobs=1, progress=False)


def test_command_line_reports_missing_synthesisers(tmp_path):
    env = {**os.environ, "PATH": str(tmp_path), "PYTHONPATH": str(Path(__file__).parents[2])}
    done = subprocess.run([sys.executable, "-m", "recipes.synth.prepare", "--out", str(tmp_path / "out"),
                           "--train", "2", "--dev", "1", "--test", "1", "--jobs", "1"],
                          capture_output=True, text=True, env=env)
    assert done.returncode == 1          # the machine lacks programs: not a mistake in the command
    assert "apt-get install -y espeak-ng flite sox" in done.stderr and "Traceback" not in done.stderr


def test_command_line_usage_errors_exit_2_with_one_line(tmp_path, capsys):
    from recipes.synth.prepare import main
    (tmp_path / "a_file").write_text("")
    assert main(["--out", str(tmp_path / "a_file" / "corpus"), "--train", "2", "--dev", "1", "--test", "1"]) == 2
    error = capsys.readouterr().err
    assert error.strip().splitlines() == [f"recipes.synth.prepare: error: --out {tmp_path}/a_file/corpus: "
                                          "cannot create the folder (Not a directory)"]
    assert main(["--out", str(tmp_path / "corpus"), "--train", "-1"]) == 2
    assert "the number of train utterances must be an integer >= 0, got -1" in capsys.readouterr().err

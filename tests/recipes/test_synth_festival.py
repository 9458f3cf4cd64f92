"""The synthetic corpus's optional festival voices (--extra-voices festival): the phone mapping,
festival saying known words, a tiny corpus with the option on, the default corpus unchanged with it
off, the refusal of a folder made with another voice set, and missing festival programs or voices."""

import gzip
import json
import os
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest
import soundfile

from asr.text.phones import ARPABET_39
from asr.text.synthesiser_phonemes import FESTIVAL_TO_ARPABET, UnmappablePhonemeError, festival_to_arpabet
from recipes.synth.plans import SPLITS, UtterancePlan, plan_utterances
from recipes.synth.prepare import _check_config, generate_corpus, main, prepare_synth
from recipes.synth.sentences import load_sentences
from recipes.synth.synthesis import synthesise_plan
from recipes.synth.voices import (
    FESTIVAL_SPEAKERS, FESTIVAL_VOICES, HELD_OUT_SPEAKER_IDS, SPEAKERS, SPEAKERS_BY_ID, MissingSynthesiserError,
    check_synthesisers, installed_festival_voices, synthesise,
)

HAVE_BASE = all(shutil.which(p) for p in ("espeak-ng", "flite", "sox"))
HAVE_FESTIVAL = HAVE_BASE and shutil.which("festival") is not None and \
    set(FESTIVAL_VOICES) <= installed_festival_voices()
needs_festival = pytest.mark.skipif(not HAVE_FESTIVAL, reason="festival or its US voices not installed "
                                    "(bash .ci/install.sh installs them)")
FIXTURES = Path(__file__).parent

# ----------------------------------------------------------------------------- phone mapping

# The radio phone set of festival's US voices, written out from festival's lib/radio_phones.scm.
RADIO_PHONES = ("aa ae ah ao aw ax axr ay b ch d dh dx eh el em en er ey f g hh hv ih iy jh k l m n nx ng "
                "ow oy p r s sh t th uh uw v w y z zh").split()
RADIO_SILENCES = ("pau", "h#", "brth")


def test_every_radio_phone_maps_into_arpabet_39():
    assert set(FESTIVAL_TO_ARPABET) == set(RADIO_PHONES)
    assert {FESTIVAL_TO_ARPABET[p.lower()] for p in ARPABET_39} == {(p,) for p in ARPABET_39}
    assert festival_to_arpabet(" ".join(RADIO_SILENCES)) == []


@pytest.mark.parametrize("segments, expected", [
    (" pau dh ax k ae t pau", "DH AH K AE T"),                        # the cat: ax is AH, pauses dropped
    (" pau b aa t pau", "B AA T"),                                     # kal's "but": its unit for ah is aa
    (" pau hh er +r r uw m pau", "HH ER R UW M"),                      # ked's "her room": the inserted r goes,
    (" pau m ah dh er +r pau", "M AH DH ER"),                          # the next word's r stays
    (" pau b ah t ax n pau", "B AH T AH N"),                           # button
    (" pau hh axr dx el pau", "HH ER T AH L"),                         # TIMIT-style radio phones fold
])
def test_festival_segments_map_to_cmudict_phones(segments, expected):
    assert " ".join(festival_to_arpabet(segments)) == expected


@pytest.mark.parametrize("segments, foreign", [
    (" pau b aa xx pau", "xx"),        # not a radio phone
    (" pau b +r aa t pau", "+r"),      # an inserted r that ends no er
    (" pau k ae +t pau", "+t"),        # any other inserted segment
])
def test_unknown_or_inserted_festival_segments_are_reported(segments, foreign):
    with pytest.raises(UnmappablePhonemeError) as error:
        festival_to_arpabet(segments)
    assert error.value.engine == "festival" and error.value.phoneme == foreign


# ----------------------------------------------------------------------------- festival saying words

DEFAULT_VOICING = {"kal_diphone": {"duration_stretch": 1.1, "f0_mean_hz": 105.0},
                   "ked_diphone": {"duration_stretch": 1.1, "f0_mean_hz": 105.0},
                   "cmu_us_slt_arctic_hts": {"duration_stretch": 1.0}}


def _festival_phones(words: str, voice: str, tmp_path: Path) -> str:
    speaker = next(s for s in FESTIVAL_SPEAKERS if s.voice == voice)
    return " ".join(synthesise(words, speaker, DEFAULT_VOICING[voice], 0.0, tmp_path / "words.flac").phones)


# CMUdict's phones without stress; kal says every AH with its AA diphones (the last column).
KNOWN_WORDS = [
    ("cat", "K AE T", "K AE T"),
    ("the car", "DH AH K AA R", "DH AH K AA R"),
    ("story", "S T AO R IY", "S T AO R IY"),
    ("her room", "HH ER R UW M", "HH ER R UW M"),
    ("the poor oil boy", "DH AH P UH R OY L B OY", "DH AH P UH R OY L B OY"),
    ("mother", "M AH DH ER", "M AA DH ER"),
    ("button", "B AH T AH N", "B AA T AH N"),
    ("measure", "M EH ZH ER", "M EH ZH ER"),
    ("fire", "F AY ER", "F AY ER"),
]


@needs_festival
@pytest.mark.parametrize("words, cmudict, kal", KNOWN_WORDS)
def test_festival_voices_say_known_words_with_cmudict_phones(words, cmudict, kal, tmp_path):
    assert _festival_phones(words, "ked_diphone", tmp_path) == cmudict
    assert _festival_phones(words, "cmu_us_slt_arctic_hts", tmp_path) == cmudict
    assert _festival_phones(words, "kal_diphone", tmp_path) == kal


@needs_festival
def test_festival_voicing_changes_duration_and_pitch(tmp_path):
    text = "The children went to the playground after school."
    kal = SPEAKERS_BY_ID["festival-kal"]

    def speak(prosody):
        synthesise(text, kal, prosody, 0.0, tmp_path / "kal.flac")
        samples, rate = soundfile.read(tmp_path / "kal.flac", dtype="float32")
        return samples, rate

    slow, rate = speak({"duration_stretch": 1.3, "f0_mean_hz": 105.0})
    fast, _ = speak({"duration_stretch": 0.9, "f0_mean_hz": 105.0})
    high, _ = speak({"duration_stretch": 1.3, "f0_mean_hz": 140.0})
    assert len(slow) / len(fast) == pytest.approx(1.3 / 0.9, rel=0.1)
    assert _median_f0(high, rate) / _median_f0(slow, rate) == pytest.approx(140 / 105, rel=0.1)

    hts = SPEAKERS_BY_ID["festival-slt-hts"]
    lengths = [synthesise(text, hts, {"duration_stretch": stretch}, 0.0, tmp_path / "slt.flac").num_samples
               for stretch in (0.9, 1.2)]
    assert lengths[1] / lengths[0] == pytest.approx(1.2 / 0.9, rel=0.1)


def _median_f0(samples: np.ndarray, rate: int) -> float:
    """Median F0 of the voiced 40 ms frames by autocorrelation (60-400 Hz)."""
    frame, hop, f0s = int(0.04 * rate), int(0.01 * rate), []
    for start in range(0, len(samples) - frame, hop):
        window = samples[start:start + frame] * np.hanning(frame)
        if np.sqrt(np.mean(window ** 2)) < 0.01:
            continue
        correlation = np.correlate(window, window, "full")[frame - 1:]
        low, high = rate // 400, rate // 60
        lag = low + int(np.argmax(correlation[low:high]))
        if correlation[lag] > 0.5 * correlation[0]:
            f0s.append(rate / lag)
    return float(np.median(f0s))


@needs_festival
def test_an_utterance_needing_a_diphone_the_voice_lacks_is_dropped(tmp_path):
    # ked's "pluralize" (P L UH ER ...) needs an uh-er diphone, which its database does not have
    plan = UtterancePlan(id="synth-train-000000", split="train", index=0, sentences=("We pluralize nouns.",),
                         speaker="festival-ked", prosody={"duration_stretch": 1.1, "f0_mean_hz": 105.0})
    record = synthesise_plan(tmp_path, plan)
    assert record["dropped"] == "missing festival diphone" and record["phoneme"] == "uh-er"
    assert not list((tmp_path / "audio").glob("**/*.*"))  # no audio, whole or partial
    # kal has the diphone
    kal = SPEAKERS_BY_ID["festival-kal"]
    assert synthesise("We pluralize nouns.", kal, {"duration_stretch": 1.1, "f0_mean_hz": 105.0}, 0.0,
                      tmp_path / "kal.flac").phones[2:6] == ["P", "L", "UH", "ER"]


# ----------------------------------------------------------------------------- plans

def test_without_extra_voices_the_plans_are_those_made_before_the_option():
    fixture = json.loads((FIXTURES / "synth_default_plans.json").read_text())["plans"]
    plans = plan_utterances(load_sentences(), seed=0, counts={"train": 30, "dev": 30, "test": 30})
    now = [[p.id, p.speaker, p.prosody, p.gain_db, list(p.sentences)] for split in SPLITS for p in plans[split]]
    assert now == fixture


def test_festival_takes_a_quarter_of_seen_utterances_from_espeak_and_changes_nothing_else():
    sentences = load_sentences()
    counts = {"train": 3000, "dev": 200, "test": 200}
    default = plan_utterances(sentences, seed=0, counts=counts)
    festival = plan_utterances(sentences, seed=0, counts=counts, extra_voices=("festival",))
    for split in SPLITS:
        seen = 0
        engines = {"espeak-ng": 0, "flite": 0, "festival": 0}
        for before, after in zip(default[split], festival[split], strict=True):
            assert (after.id, after.sentences, after.gain_db) == (before.id, before.sentences, before.gain_db)
            if after.speaker != before.speaker:  # only seen espeak-ng utterances change, to festival
                assert SPEAKERS_BY_ID[before.speaker].engine == "espeak-ng"
                assert before.speaker not in HELD_OUT_SPEAKER_IDS
                assert SPEAKERS_BY_ID[after.speaker].engine == "festival"
            else:
                assert after.prosody == before.prosody
            if after.speaker not in HELD_OUT_SPEAKER_IDS:
                seen += 1
                engines[SPEAKERS_BY_ID[after.speaker].engine] += 1
        if split == "train":
            assert engines["festival"] / seen == pytest.approx(0.25, abs=0.03)
            assert engines["flite"] / seen == pytest.approx(0.25, abs=0.03)
            assert {p.speaker for p in festival[split]} >= {s.id for s in FESTIVAL_SPEAKERS}
    festival_plans = [p for split in SPLITS for p in festival[split] if p.speaker.startswith("festival-")]
    for plan in festival_plans:
        voice = FESTIVAL_VOICES[SPEAKERS_BY_ID[plan.speaker].voice]
        assert 0.85 <= plan.prosody["duration_stretch"] / voice.duration_stretch <= 1.2
        if voice.f0_mean_hz is None:
            assert set(plan.prosody) == {"duration_stretch"}
        else:
            assert 0.85 <= plan.prosody["f0_mean_hz"] / voice.f0_mean_hz <= 1.2


# ----------------------------------------------------------------------------- a tiny corpus

FOREIGN_SENTENCES = ["Bach wrote this fugue for the organ.", "we listened to Bach all evening."]


def _tiny_sentences():  # as tests/recipes/test_synth.py's: espeak-ng drops the Bach utterances
    return load_sentences()[1000:1020] + FOREIGN_SENTENCES * 5


# seed 9 gives train 4 festival utterances (all three voices) and dev one
TINY_COUNTS, TINY_SEED = {"train": 6, "dev": 2, "test": 3}, 9


@pytest.fixture(scope="module")
def tiny_festival_corpora(tmp_path_factory):
    if not HAVE_FESTIVAL:
        pytest.skip("festival or its US voices not installed")
    root = tmp_path_factory.mktemp("synth_festival")
    reports = {}
    for name, jobs, extra_voices in (("jobs1", 1, "festival"), ("jobs2", 2, "festival"), ("default", 1, None)):
        reports[name] = generate_corpus(root / name, TINY_COUNTS, seed=TINY_SEED, jobs=jobs, progress=False,
                                        sentences=_tiny_sentences(), extra_voices=extra_voices)
    return root, reports


def _read_cuts(folder, split):
    with gzip.open(folder / f"synth_cuts_{split}.jsonl.gz", "rt") as lines:
        return [json.loads(line) for line in lines]


@needs_festival
def test_tiny_festival_corpus_has_festival_speakers_16khz_audio_and_targets(tiny_festival_corpora):
    root, reports = tiny_festival_corpora
    folder = root / "jobs1"
    speakers = {split: [c["supervisions"][0]["speaker"] for c in _read_cuts(folder, split)] for split in SPLITS}
    assert {s for s in speakers["train"] if s.startswith("festival-")} == {s.id for s in FESTIVAL_SPEAKERS}
    assert reports["jobs1"]["splits"]["train"]["engines"]["festival"] == \
        sum(s.startswith("festival-") for s in speakers["train"])
    assert reports["jobs1"]["request"]["extra_voices"] == ["festival"]
    assert reports["jobs1"]["speakers"] == [s.id for s in SPEAKERS + FESTIVAL_SPEAKERS]
    assert json.loads((folder / "synth_config.json").read_text())["extra_voices"] == ["festival"]
    for split in SPLITS:
        for cut in _read_cuts(folder, split):
            if not cut["supervisions"][0]["speaker"].startswith("festival-"):
                continue
            samples, rate = soundfile.read(folder / cut["recording"]["sources"][0]["source"], dtype="float32")
            assert rate == 16000 and samples.ndim == 1 and len(samples) == cut["recording"]["num_samples"]
            assert cut["duration"] == pytest.approx(len(samples) / 16000)
            words = len(cut["supervisions"][0]["text"].split())
            assert 0.15 < cut["duration"] / words < 0.8
            assert 0.01 < np.sqrt(np.mean(samples ** 2)) and np.abs(samples).max() <= 1.0
            assert set(cut["supervisions"][0]["custom"]["phones"].split()) <= set(ARPABET_39)


def _text_analysis_phones(text: str, voice: str) -> str:
    """festival's segment names for ``text`` from its text analysis alone (no waveform synthesis, so no
    voice's synthesis hooks), mapped to ARPAbet, with kal's AA for every ah (its diphone choice)."""
    escaped = text.replace("\\", "\\\\").replace('"', '\\"')
    script = (f'(voice_{voice})\n(set! u (eval (list (quote Utterance) (quote Text) "{escaped}")))\n'
              "(mapcar (lambda (module) (module u)) (list Initialize Text Token_POS Token POS Phrasify Word "
              "Pauses Intonation PostLex))\n"
              '(format t "names:") (mapcar (lambda (s) (format t " %s" (item.name s))) '
              "(utt.relation.items u 'Segment)) (format t \"\\n\")\n")
    output = subprocess.run(["festival", "--pipe"], input=script, capture_output=True, text=True, check=True).stdout
    names = next(line for line in output.splitlines() if line.startswith("names:")).split()[1:]
    phones = []
    for name in names:
        if name in RADIO_SILENCES:
            continue
        phones += ["AA"] if (voice == "kal_diphone" and name == "ah") else list(FESTIVAL_TO_ARPABET[name])
    return " ".join(phones)


@needs_festival
def test_festival_phones_are_what_festival_said_for_the_text(tiny_festival_corpora):
    root, _ = tiny_festival_corpora
    checked = set()
    for meta in sorted((root / "jobs1" / "meta").glob("*/*.json")):
        record = json.loads(meta.read_text())
        if record["engine"] != "festival" or "dropped" in record:
            continue
        assert record["phones"] == _text_analysis_phones(" ".join(record["sentences"]), record["voice"])
        checked.add(record["voice"])
    assert checked == set(FESTIVAL_VOICES)


@needs_festival
def test_festival_corpus_is_the_same_for_any_number_of_jobs(tiny_festival_corpora):
    root, _ = tiny_festival_corpora
    for split in SPLITS:
        one, two = _read_cuts(root / "jobs1", split), _read_cuts(root / "jobs2", split)
        assert [c["supervisions"] for c in one] == [c["supervisions"] for c in two]
        for a, b in zip(one, two):
            source = a["recording"]["sources"][0]["source"]
            assert (root / "jobs1" / source).read_bytes() == (root / "jobs2" / source).read_bytes()


@needs_festival
def test_utterances_festival_does_not_speak_are_those_of_the_default_corpus(tiny_festival_corpora):
    root, _ = tiny_festival_corpora
    metas = sorted((root / "jobs1" / "meta").glob("*/*.json"))
    made = {split: sum(meta.parent.name == split for meta in metas) for split in SPLITS}  # dropped ones too
    plans = plan_utterances(_tiny_sentences(), TINY_SEED, made, extra_voices=("festival",))
    planned_for_festival = {p.id for split in SPLITS for p in plans[split] if p.speaker.startswith("festival-")}
    spoken_by_festival = set()
    for meta in metas:
        with_festival = json.loads(meta.read_text())
        default = json.loads((root / "default" / "meta" / meta.parent.name / meta.name).read_text())
        assert with_festival["sentences"] == default["sentences"] and with_festival["gain_db"] == default["gain_db"]
        if with_festival["engine"] == "festival":
            spoken_by_festival.add(with_festival["id"])
            continue
        assert with_festival == default
        if "audio" in default:
            audio = default["audio"]
            assert (root / "jobs1" / audio).read_bytes() == (root / "default" / audio).read_bytes()
    assert spoken_by_festival == planned_for_festival and len(spoken_by_festival) >= 5


# ----------------------------------------------------------------------------- the folder's voice set

@needs_festival
def test_a_folder_made_with_another_voice_set_is_refused(tiny_festival_corpora, tmp_path):
    root, reports = tiny_festival_corpora
    for made, asked, there, now in (("jobs1", None, "['festival']", "None"), ("default", "festival", "None",
                                                                               "['festival']")):
        folder = tmp_path / made
        shutil.copytree(root / made, folder)
        with pytest.raises(ValueError) as error:
            generate_corpus(folder, TINY_COUNTS, seed=TINY_SEED, jobs=1, progress=False,
                            sentences=_tiny_sentences(), extra_voices=asked)
        message = str(error.value)
        assert f"extra_voices: {there} there, {now} now" in message and "\n" not in message
        assert "use another folder" in message
    # asked again with the same voice set, the complete folder is returned as it is
    assert generate_corpus(tmp_path / "jobs1", TINY_COUNTS, seed=TINY_SEED, jobs=1, progress=False,
                           sentences=_tiny_sentences(), extra_voices="festival") == reports["jobs1"]


def test_voice_set_is_part_of_the_folder_config(tmp_path):
    _check_config(tmp_path, 0, ["a b c"], 1)
    assert "extra_voices" not in json.loads((tmp_path / "synth_config.json").read_text())
    with pytest.raises(ValueError, match=r"extra_voices: None there, \['festival'\] now"):
        _check_config(tmp_path, 0, ["a b c"], 1, ("festival",))


def test_unknown_extra_voices_are_a_usage_error(tmp_path, capsys):
    assert main(["--out", str(tmp_path / "corpus"), "--train", "2", "--extra-voices", "mbrola"]) == 2
    error = capsys.readouterr().err.strip().splitlines()
    assert error == ["recipes.synth.prepare: error: unknown extra voices 'mbrola' (--extra-voices, or "
                     "synth_corpus.extra_voices in asr.train); the choices are: festival, piper"]
    assert not (tmp_path / "corpus" / "synth_config.json").exists()


# ----------------------------------------------------------------------------- missing festival

def _bin_with(tmp_path, programs):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    for program in programs:
        os.symlink(shutil.which(program), bin_dir / program)
    return bin_dir


@pytest.mark.skipif(not HAVE_BASE, reason="espeak-ng, flite or sox not installed")
def test_missing_festival_is_named_only_when_festival_voices_are_asked_for(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(_bin_with(tmp_path, ("espeak-ng", "flite", "sox"))))
    check_synthesisers()  # the default voices need no festival
    with pytest.raises(MissingSynthesiserError) as error:
        prepare_synth(tmp_path / "out", 2, 1, 1, jobs=1, progress=False, extra_voices="festival")
    message = str(error.value)
    assert "needs the program(s) festival, not found on PATH" in message and "\n" not in message
    assert "apt-get install -y festival festvox-kallpc16k festvox-kdlpc16k festvox-us-slt-hts`" in message


@pytest.mark.skipif(not HAVE_BASE, reason="espeak-ng, flite or sox not installed")
def test_missing_festival_voices_name_their_packages(tmp_path, monkeypatch):
    bin_dir = _bin_with(tmp_path, ("espeak-ng", "flite", "sox"))
    # a festival that knows only kal_diphone (and a voice the corpus does not use)
    (bin_dir / "festival").write_text("#!/bin/sh\necho 'voices: (kal_diphone rab_diphone)'\n")
    (bin_dir / "festival").chmod(0o755)
    monkeypatch.setenv("PATH", str(bin_dir))
    with pytest.raises(MissingSynthesiserError) as error:
        check_synthesisers(("festival",))
    message = str(error.value)
    assert "needs the festival voice(s) ked_diphone, cmu_us_slt_arctic_hts, not installed" in message
    assert "apt-get install -y festvox-kdlpc16k festvox-us-slt-hts`" in message


@needs_festival
def test_installed_festival_lists_the_three_voices():
    assert set(FESTIVAL_VOICES) <= installed_festival_voices()

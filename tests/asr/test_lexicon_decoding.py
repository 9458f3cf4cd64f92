"""Lexicon + n-gram LM decoding (asr.evaluation.decoding): the decoder on hand-made emissions, the modified
Kneser-Ney estimator against hand-computed probabilities, the synth recipe's lexicon and LM,
and one clear error for each bad input."""
from __future__ import annotations

import gzip
import json
import math
import os
from fractions import Fraction
from pathlib import Path

import numpy as np
import pytest

from asr.data.splits.tokenizers import build_tokenizer
from asr.evaluation.decoding.lexicon import LexiconFileError, read_lexicon, words_to_phones
from asr.evaluation.decoding.lexicon_decoder import LexiconDecoder, LexiconDecoderSettings, ParallelLexiconDecoder
from asr.evaluation.decoding.ngram import (LanguageModelError, arpa_text, discounts, estimate_arpa,
                                estimate_ngram_probabilities, read_arpa_vocabulary)
from asr.model.ctc import greedy_decode

PHONES = build_tokenizer("phones")


def emissions(frames: list[dict[str, float]]) -> np.ndarray:
    """(frames, classes) log-probabilities: each frame's listed symbols ('-' = blank) get their
    probability, the rest share what is left."""
    rows = []
    for frame in frames:
        rest = (1.0 - sum(frame.values())) / (PHONES.vocab_size - len(frame))
        row = np.full(PHONES.vocab_size, math.log(rest))
        for symbol, probability in frame.items():
            row[0 if symbol == "-" else PHONES.encode(symbol)[0]] = math.log(probability)
        rows.append(row)
    return np.array(rows, dtype=np.float32)


def greedy_phones(log_probs: np.ndarray) -> str:
    import torch
    ids = greedy_decode(torch.from_numpy(log_probs)[None], torch.tensor([len(log_probs)]))[0]
    return PHONES.decode(ids)


def write(path: Path, text: str) -> Path:
    path.write_text(text)
    return path


# "cat" spoken with an unclear vowel: AA is (slightly) the likeliest phone in that frame, but no
# word is spelled K AA T, so the lexicon's best path is K AE T = cat.
CAT_WITH_UNCLEAR_VOWEL = [{"K": 0.9}, {"-": 0.9}, {"AA": 0.45, "AE": 0.4}, {"-": 0.9}, {"T": 0.9}, {"-": 0.9}]


def test_the_lexicon_turns_ambiguous_phones_into_the_word_greedy_misses(tmp_path):
    lexicon = write(tmp_path / "lexicon.txt", "cat K AE T\ncut K AH T\nbat B AE T\n")
    log_probs = emissions(CAT_WITH_UNCLEAR_VOWEL)
    assert greedy_phones(log_probs) == "K AA T"                      # not a word
    decoder = LexiconDecoder(PHONES, LexiconDecoderSettings(lexicon=str(lexicon)))
    assert decoder.decode(log_probs) == "cat"


def test_the_lm_chooses_between_words_the_acoustics_cannot_tell_apart(tmp_path):
    # "red" and "read" (past tense) sound the same; the LM has seen "i read" and "the red ..."
    lexicon = write(tmp_path / "lexicon.txt", "i AY\nread R EH D\nred R EH D\nthe DH AH\nbook B UH K\n")
    lm = estimate_arpa(["i read the book", "i read the book", "the red book"], tmp_path / "lm.arpa", order=2,
                       vocabulary=read_lexicon(lexicon))
    spoken = [{"AY": 0.9}, {"-": 0.9}, {"R": 0.9}, {"EH": 0.9}, {"D": 0.9}, {"-": 0.9}]
    log_probs = emissions(spoken)
    for lm_path, expected in ((lm, "i read"), (estimate_arpa(["i red", "i red"], tmp_path / "other.arpa.gz",
                                                              order=2, vocabulary=read_lexicon(lexicon)), "i red")):
        decoder = LexiconDecoder(PHONES, LexiconDecoderSettings(lexicon=str(lexicon), lm=str(lm_path),
                                                                lm_weight=2.0))
        assert decoder.decode(log_probs) == expected


def test_worker_processes_decode_what_one_process_decodes(tmp_path):
    lexicon = write(tmp_path / "lexicon.txt", "cat K AE T\ncut K AH T\nbat B AE T\n")
    settings = LexiconDecoderSettings(lexicon=str(lexicon))
    rng = np.random.default_rng(0)
    inputs = [emissions(CAT_WITH_UNCLEAR_VOWEL)] + [
        np.log(rng.dirichlet(np.full(PHONES.vocab_size, 0.2), size=12)).astype(np.float32) for _ in range(5)]
    alone = LexiconDecoder(PHONES, settings)
    with ParallelLexiconDecoder(PHONES, settings, workers=2) as parallel:
        results = [parallel.submit(x) for x in inputs]
        assert [r.get() for r in results] == [alone.decode(x) for x in inputs]


# ---- the LM estimator --------------------------------------------------------------------------------
def test_modified_kneser_ney_discounts_from_the_count_of_counts():
    # n1=4, n2=2, n3=1, n4=1: Y = 4/(4+4) = 1/2; D1 = 1 - 2Y n2/n1 = 1/2; D2 = 2 - 3Y n3/n2 = 5/4;
    # D3+ = 3 - 4Y n4/n3 = 1
    assert discounts([1, 1, 1, 1, 2, 2, 3, 4, 7]) == pytest.approx((0.5, 1.25, 1.0))
    assert discounts([1, 1, 2]) == (0.5, 1.0, 1.5)     # n3 = n4 = 0: the fallback


def test_the_estimator_gives_the_probabilities_computed_by_hand(tmp_path):
    # Text: "a b", "b a", "a" -> <s> a b </s> / <s> b a </s> / <s> a </s>; vocabulary a b </s> <unk>.
    # Bigram counts <s>a:2 ab:1 b</s>:1 <s>b:1 ba:1 a</s>:2 -> n3 = 0, so D = (1/2, 1, 3/2).
    # Unigram continuation counts a:2 ({<s>,b}) b:2 ({a,<s>}) </s>:2 ({a,b}) -> total 6,
    #   p(w) = (2-1)/6 + gamma/4 with gamma = 1*3/6 = 1/2: 7/24 each; p(<unk>) = 1/8.
    # Context <s>: a:2, b:1, total 3, gamma = (1/2 + 1)/3 = 1/2:
    #   p(a|<s>) = 1/3 + 1/2*7/24 = 23/48, p(b|<s>) = (1/2)/3 + 7/48 = 15/48, p(</s>|<s>) = 7/48 (backoff).
    # Context a: b:1, </s>:2 -> p(b|a) = 15/48, p(</s>|a) = 23/48. Context b: </s>:1, a:1, total 2,
    #   gamma = (1/2*2)/2 = 1/2 -> p(a|b) = p(</s>|b) = 1/4 + 7/48 = 19/48.
    model = estimate_ngram_probabilities(["a b", "b a", "a"], order=2)
    expected_unigrams = {"a": Fraction(7, 24), "b": Fraction(7, 24), "</s>": Fraction(7, 24), "<unk>": Fraction(1, 8)}
    for word, probability in expected_unigrams.items():
        assert model[0][(word,)][0] == pytest.approx(float(probability))
    expected_bigrams = {("<s>", "a"): Fraction(23, 48), ("<s>", "b"): Fraction(15, 48), ("a", "b"): Fraction(15, 48),
                        ("a", "</s>"): Fraction(23, 48), ("b", "a"): Fraction(19, 48), ("b", "</s>"): Fraction(19, 48)}
    assert set(model[1]) == set(expected_bigrams)
    for gram, probability in expected_bigrams.items():
        assert model[1][gram][0] == pytest.approx(float(probability))
    for context in ("<s>", "a", "b"):
        assert model[0][(context,)][1] == pytest.approx(0.5)
    # KenLM (inside the decoder's engine) reads the ARPA file to the same numbers, backoff included
    path = estimate_arpa(["a b", "b a", "a"], tmp_path / "toy.arpa.gz", order=2)
    from flashlight.lib.text.decoder.kenlm import KenLM
    from flashlight.lib.text.dictionary import Dictionary
    words = Dictionary()
    for word in ("<unk>", "a", "b"):
        words.add_entry(word)
    lm = KenLM(str(path), words)
    state = lm.start(False)
    state, score = lm.score(state, words.get_index("a"))
    assert score == pytest.approx(math.log10(23 / 48), abs=1e-5)
    state, score = lm.score(state, words.get_index("b"))
    assert score == pytest.approx(math.log10(15 / 48), abs=1e-5)
    _, score = lm.finish(lm.start(False))                                  # p(</s> | <s>), a backoff
    assert score == pytest.approx(math.log10(7 / 48), abs=1e-5)


@pytest.mark.parametrize("order", [1, 3, 4])
def test_every_context_is_a_distribution(order):
    rng = np.random.default_rng(order)
    sentences = [" ".join(rng.choice(list("abcdefg"), size=rng.integers(1, 8))) for _ in range(60)]
    model = estimate_ngram_probabilities(sentences, order=order, vocabulary=["unseen"])
    vocabulary = [gram[0] for gram in model[0] if gram != ("<s>",)]

    def probability(history: tuple[str, ...], word: str) -> float:      # ARPA backoff semantics
        gram = history + (word,)
        if gram in model[len(gram) - 1]:
            return model[len(gram) - 1][gram][0]
        weight = model[len(history) - 1][history][1] if history and history in model[len(history) - 1] else 1.0
        return weight * probability(history[1:], word)

    contexts = {gram[:-1] for n in range(1, order) for gram in model[n]} | {()}
    for context in contexts:
        assert sum(probability(context, word) for word in vocabulary) == pytest.approx(1.0, abs=1e-9)


# ---- the recipe ---------------------------------------------------------------------------------------
def texts(root: Path, split: str) -> list[str]:
    with gzip.open(root / f"synth_supervisions_{split}.jsonl.gz", "rt") as handle:
        return [json.loads(line)["text"] for line in handle]


def test_the_synth_recipe_writes_a_closed_lexicon_and_a_training_only_lm(tiny_synth, tmp_path):
    lexicon = read_lexicon(tiny_synth / "lexicon.txt")
    words = {word for split in ("train", "dev", "test") for text in texts(tiny_synth, split) for word in text.split()}
    assert set(lexicon) == words
    PHONES.encode(" ".join(p for spellings in lexicon.values() for s in spellings for p in s))  # all ARPABET_39
    vocabulary, counts = read_arpa_vocabulary(tiny_synth / "lm" / "3gram.arpa.gz")
    assert len(counts) == 3 and words <= vocabulary
    train_words = {word for text in texts(tiny_synth, "train") for word in text.split()}
    with gzip.open(tiny_synth / "lm" / "3gram.arpa.gz", "rt") as handle:
        higher = [line.split("\t")[1].split() for line in handle if line.count("\t") and len(line.split("\t")[1].split()) > 1]
    assert {word for gram in higher for word in gram} <= train_words | {"<s>", "</s>"}   # dev/test text unseen
    # resumable: a complete folder without them gains them on a rerun, and what exists is kept
    from recipes.synth.prepare import generate_corpus
    report = json.loads((tiny_synth / "synth_report.json").read_text())
    copy = tmp_path / "copy"
    os.symlink(tiny_synth, copy)   # the same folder; only the two files change
    lm_time = (tiny_synth / "lm" / "3gram.arpa.gz").stat().st_mtime_ns
    (tiny_synth / "lexicon.txt").unlink()
    generate_corpus(copy, report["request"]["counts"], seed=report["request"]["seed"], jobs=1, progress=False)
    assert read_lexicon(tiny_synth / "lexicon.txt") == lexicon
    assert (tiny_synth / "lm" / "3gram.arpa.gz").stat().st_mtime_ns == lm_time


def test_a_lexicon_turns_word_references_into_phone_references(tmp_path):
    lexicon = read_lexicon(write(tmp_path / "cmu.txt", ";;; CMUdict\nCAT  K AE1 T\nCAT(2)  K AA1 T\nTHE  DH AH0\n"))
    assert lexicon == {"cat": [("K", "AE", "T"), ("K", "AA", "T")], "the": [("DH", "AH")]}
    assert words_to_phones("the cat sat", lexicon) == ("DH AH K AE T", ["sat"])


# ---- bad input: one message each, before decoding ----------------------------------------------------
def bad_inputs(folder: Path) -> dict[str, tuple[dict, type, list[str]]]:
    good_lexicon = write(folder / "good.txt", "cat K AE T\ndog D AO G\nbird B ER D\n")
    good_lm = estimate_arpa(["cat dog", "dog bird"], folder / "good.arpa", order=2)
    lm_of_other_words = estimate_arpa(["fish fowl"], folder / "other.arpa", order=2)
    uppercase = estimate_arpa(["CAT DOG", "DOG BIRD", "FISH"], folder / "upper.arpa", order=2)
    unigram = estimate_arpa(["cat dog bird"], folder / "unigram.arpa", order=1)
    broken = write(folder / "broken.arpa", good_lm.read_text().replace("\\2-grams:", "\\2-grams:\nnot a line"))
    truncated = write(folder / "truncated.arpa", "\n".join(good_lm.read_text().splitlines()[:8]))
    return {
        "missing lexicon": ({"lexicon": str(folder / "nope.txt")}, LexiconFileError, ["nope.txt", "does not exist"]),
        "malformed lexicon": ({"lexicon": str(write(folder / "bad.txt", "cat K AE T\nlonely\nodd\n"))},
                              LexiconFileError, ["2 lines", "line 2", "'lonely'"]),
        "phones outside the model's set": ({"lexicon": str(write(folder / "ipa.txt", "cat k æ t\ndog D AO G\nox AA KS\n"))},
                                           LexiconFileError, ["2 words", "2 phones", "'Æ'", "'KS'", "'cat'"]),
        "missing LM": ({"lexicon": str(good_lexicon), "lm": str(folder / "nope.arpa")}, LanguageModelError,
                       ["nope.arpa", "does not exist"]),
        "not ARPA": ({"lexicon": str(good_lexicon), "lm": str(write(folder / "text.arpa", "hello world\n"))},
                     LanguageModelError, ["not ARPA", "line 1"]),
        "truncated ARPA": ({"lexicon": str(good_lexicon), "lm": str(truncated)}, LanguageModelError, ["truncated"]),
        "malformed ARPA body": ({"lexicon": str(good_lexicon), "lm": str(broken)}, LanguageModelError,
                                ["broken.arpa", "KenLM"]),
        "unigram LM": ({"lexicon": str(good_lexicon), "lm": str(unigram)}, LanguageModelError, ["order 2"]),
        "LM knowing none of the lexicon's words": ({"lexicon": str(good_lexicon), "lm": str(lm_of_other_words)},
                                                   LanguageModelError, ["knows none of the lexicon's 3 words", "'cat'",
                                                                        "asr.build_lm"]),
        "uppercase LM": ({"lexicon": str(good_lexicon), "lm": str(uppercase)}, LanguageModelError,
                         ["uppercase", "tr A-Z a-z"]),
        "extra lexicon with phones outside the model's set": (
            {"lexicon": str(good_lexicon), "extra_lexicon": str(write(folder / "extra.txt", "ox AA KS\n"))},
            LexiconFileError, ["extra.txt", "'KS'", "'ox'"]),
    }


def test_each_bad_input_is_one_clear_message(tmp_path):
    for name, (settings, error, says) in bad_inputs(tmp_path).items():
        with pytest.raises(error) as raised:
            LexiconDecoder(PHONES, LexiconDecoderSettings(**settings))
        message = str(raised.value)
        assert "\n" not in message, name
        for part in says:
            assert part in message, (name, part, message)


# ---- lexicon words the LM lacks: decoded with the LM's <unk> probability ---------------------------------
SPOKEN_I_RED = [{"AY": 0.9}, {"-": 0.9}, {"R": 0.9}, {"EH": 0.9}, {"D": 0.9}, {"-": 0.9}]   # "i read" = "i red"
SPOKEN_I_CAT = [{"AY": 0.9}, {"-": 0.9}, {"K": 0.9}, {"AE": 0.9}, {"T": 0.9}, {"-": 0.9}]


def lexicon_beyond_the_lm(folder: Path) -> tuple[Path, Path]:
    """A lexicon of i, read, red, cat and an LM of "i read" only: red and cat are not in the LM."""
    lexicon = write(folder / "lexicon.txt", "i AY\nread R EH D\nred R EH D\ncat K AE T\n")
    return lexicon, estimate_arpa(["i read", "i read"], folder / "lm.arpa", order=2)


def test_a_lexicon_word_the_lm_lacks_is_decoded_with_the_lms_unk_probability(tmp_path):
    lexicon, lm = lexicon_beyond_the_lm(tmp_path)
    decoder = LexiconDecoder(PHONES, LexiconDecoderSettings(lexicon=str(lexicon), lm=str(lm)))
    assert sorted(decoder.words_outside_lm) == ["cat", "red"] and decoder.lexicon_words == {"i", "read", "red", "cat"}
    assert decoder.decode(emissions(SPOKEN_I_CAT)) == "i cat"          # a word the LM lacks can be output
    assert decoder.decode(emissions(SPOKEN_I_RED)) == "i read"         # where the acoustics tie, the LM's word wins
    # the score KenLM gives "cat" after <s> is the ARPA file's p(<unk> | <s>): <s> has no <unk> bigram,
    # so it is backoff(<s>) * p(<unk>), from the estimator's own tables
    model = estimate_ngram_probabilities(["i read", "i read"], order=2)
    expected = math.log10(model[0][("<s>",)][1] * model[0][("<unk>",)][0])
    _, score = decoder.lm.score(decoder.lm.start(False), decoder.words.index("cat"))
    assert score == pytest.approx(expected, abs=1e-5)
    # restrict_lexicon keeps its meaning: the words the LM lacks are dropped
    restricted = LexiconDecoder(PHONES, LexiconDecoderSettings(lexicon=str(lexicon), lm=str(lm), restrict_lexicon=True))
    assert restricted.lexicon_words == {"i", "read"} and restricted.decode(emissions(SPOKEN_I_CAT)) != "i cat"


def test_an_lm_without_unk_is_named_in_a_warning(tmp_path, caplog):
    lexicon, lm = lexicon_beyond_the_lm(tmp_path)
    text = lm.read_text()
    unk = next(line for line in text.splitlines() if line.split("\t")[1:2] == ["<unk>"])
    no_unk = write(tmp_path / "no_unk.arpa", text.replace(unk + "\n", "").replace("ngram 1=5", "ngram 1=4"))
    with caplog.at_level("WARNING", logger="asr.evaluation.decoding"):
        LexiconDecoder(PHONES, LexiconDecoderSettings(lexicon=str(lexicon), lm=str(no_unk)))
    assert "no <unk> unigram" in caplog.text and "2 lexicon words" in caplog.text and "-100" in caplog.text


def test_an_extra_lexicon_adds_words_and_replaces_a_words_pronunciations(tmp_path):
    from asr.evaluation.decoding.lexicon_decoder import read_lexicons
    lexicon = write(tmp_path / "lexicon.txt", "cat K AE T\ncut K AH T\nbat B AE T\n")
    extra = write(tmp_path / "extra.txt", "zebra Z IY B R AH\ncat K AA T\n")
    settings = LexiconDecoderSettings(lexicon=str(lexicon), extra_lexicon=str(extra))
    spellings, _ = read_lexicons(settings, PHONES)
    assert {word: [PHONES.decode(list(s)) for s in ss] for word, ss in spellings.items()} == {
        "cat": ["K AA T"], "cut": ["K AH T"], "bat": ["B AE T"], "zebra": ["Z IY B R AH"]}
    decoder = LexiconDecoder(PHONES, settings)
    zebra = [{"Z": 0.9}, {"IY": 0.9}, {"B": 0.9}, {"R": 0.9}, {"AH": 0.9}, {"-": 0.9}]
    assert decoder.decode(emissions(zebra)) == "zebra"


def test_the_out_of_vocabulary_rate_counted_by_hand(tmp_path):
    from asr.evaluation.decoding.evaluation import out_of_vocabulary_report
    from asr.text.metrics import out_of_vocabulary_rate
    # 6 reference words: i red a cat / the cat. The LM knows i and read: red, a, cat, the, cat are
    # outside it, 5 of 6. The lexicon has i, read, red, cat: a and the are outside it, 2 of 6.
    references = ["i red a cat", "the cat"]
    assert out_of_vocabulary_rate(references, {"i", "read"}) == pytest.approx(5 / 6)
    assert out_of_vocabulary_rate([""], {"i"}) is None
    lexicon, lm = lexicon_beyond_the_lm(tmp_path)
    decoder = LexiconDecoder(PHONES, LexiconDecoderSettings(lexicon=str(lexicon), lm=str(lm)))
    report = out_of_vocabulary_report(references, decoder)
    assert report["reference_words"] == 6
    assert report["lm"] == pytest.approx(5 / 6) and report["lexicon"] == pytest.approx(2 / 6)
    assert report["words_outside_lm"][0] == "cat" and set(report["words_outside_lm"]) == {"red", "a", "cat", "the"}
    assert set(report["words_outside_lexicon"]) == {"a", "the"}
    without_lm = LexiconDecoder(PHONES, LexiconDecoderSettings(lexicon=str(lexicon)))
    assert out_of_vocabulary_report(references, without_lm)["lm"] is None


# ---- where it is used: asr.train's test line, asr.evaluate, asr.tune_lm, asr.cross_matrix -------------
# what trained_run's test pass ran: utterances through the model's test step, asr.evaluate's decode_split calls
TEST_PASS = {"test_step_utterances": 0, "decode_split_calls": 0}


@pytest.fixture(scope="module")
def trained_run(tiny_synth, tmp_path_factory) -> tuple[Path, dict]:
    """A tiny model trained on the tiny corpus, which ships a lexicon and an LM: the run's test
    results gain the lexicon decoder's WER. Its test pass is counted in TEST_PASS."""
    from asr.evaluation import evaluation
    from asr.model.recognizer import SpeechRecognizer
    from asr.training.fit import train
    from tiny_runs import tiny_config
    test_step, decode_split = SpeechRecognizer.test_step, evaluation.decode_split

    def counted_test_step(self, batch, batch_index):
        TEST_PASS["test_step_utterances"] += 0 if batch.get("padding") else len(batch["ids"])
        return test_step(self, batch, batch_index)

    def counted_decode_split(*arguments, **options):
        TEST_PASS["decode_split_calls"] += 1
        return decode_split(*arguments, **options)

    run = tmp_path_factory.mktemp("lexicon_run")
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(SpeechRecognizer, "test_step", counted_test_step)
        patch.setattr(evaluation, "decode_split", counted_decode_split)
        results = train(tiny_config(tiny_synth, "conf=synth_full"), run)
    return run, results


def test_training_decodes_the_test_split_once_for_its_rates_and_its_lexicon_words(trained_run, tmp_path):
    from asr.evaluation.evaluation import EvaluateConfig, evaluate
    run, results = trained_run
    # the 2 test utterances went through the model once, and no second pass decoded them for the words
    assert TEST_PASS == {"test_step_utterances": 2, "decode_split_calls": 0}
    # the words are those asr.evaluate decoder=lexicon makes of the best checkpoint in its own pass
    report = evaluate(EvaluateConfig(checkpoint=str(run / "checkpoints" / "best.ckpt"), decoder="lexicon",
                                     out=str(tmp_path / "evaluation"), progress=False))
    assert report["decoder"] == "lexicon" and report["lexicon_decoder"]["head"] == "phones"
    for name in ("wer_lexicon", "cer_lexicon", "per"):
        assert results["test"][name] == report["error_rates"][name], name
    assert results["test"]["oov_lm"] == report["out_of_vocabulary"]["lm"]


def test_evaluate_with_the_lexicon_decoder_records_its_settings_and_scores_its_words(trained_run, tiny_synth, tmp_path):
    from asr.evaluation.evaluation import EvaluateConfig, evaluate
    from asr.text.metrics import word_error_rate
    run, _ = trained_run
    checkpoint = str(run / "checkpoints" / "best.ckpt")
    report = evaluate(EvaluateConfig(checkpoint=checkpoint, decoder="lexicon", lm_weight=0.5, word_score=1.0,
                                     decode_workers=2, out=str(tmp_path / "e"), progress=False))
    settings = report["lexicon_decoder"]
    assert (settings["lm_weight"], settings["word_score"]) == (0.5, 1.0)
    # the model's own files: the copies asr.train keeps in the run folder
    assert settings["lexicon"] == str(run / "decoding" / "lexicon.txt")
    assert settings["lm"] == str(run / "decoding" / "lm" / "3gram.arpa.gz")
    records = [json.loads(line) for line in (tmp_path / "e" / "hypotheses.jsonl").read_text().splitlines()]
    words = [r["lexicon"] for r in records]
    assert report["error_rates"]["wer"] == pytest.approx(
        word_error_rate([w["reference"] for w in words], [w["hypothesis"] for w in words]))
    lexicon = read_lexicon(tiny_synth / "lexicon.txt")
    assert all(word in lexicon for w in words for word in w["hypothesis"].split())
    assert "per" in report["error_rates"]                              # still from the phone head


def kaldi_folder(tiny_synth: Path, folder: Path, added_word: str = "") -> tuple[Path, list[dict]]:
    """The tiny corpus's test utterances as a Kaldi data directory (wav.scp, text), each transcript
    followed by `added_word`; returns the folder and the cuts."""
    folder.mkdir()
    with gzip.open(tiny_synth / "synth_cuts_test.jsonl.gz", "rt") as handle:
        cuts = [json.loads(line) for line in handle]
    (folder / "wav.scp").write_text("".join(f"{c['id']} {tiny_synth / c['recording']['sources'][0]['source']}\n"
                                            for c in cuts))
    (folder / "text").write_text("".join(f"{c['id']} {c['supervisions'][0]['text']} {added_word}\n" for c in cuts))
    return folder, cuts


def test_a_kaldi_directory_gets_a_per_from_the_reference_lexicon(trained_run, tiny_synth, tmp_path):
    from asr.evaluation.evaluation import EvaluateConfig, evaluate
    from asr.text.metrics import phone_error_rate
    run, _ = trained_run
    folder, cuts = kaldi_folder(tiny_synth, tmp_path / "kaldi", "zyzzyva")
    lexicon_path = tiny_synth / "lexicon.txt"
    report = evaluate(EvaluateConfig(checkpoint=str(run / "checkpoints" / "best.ckpt"), data_dir=str(folder),
                                     reference_lexicon=str(lexicon_path), out=str(tmp_path / "k"), progress=False))
    assert report["words_missing_from_reference_lexicon"] == ["zyzzyva"]
    records = [json.loads(line) for line in (tmp_path / "k" / "hypotheses.jsonl").read_text().splitlines()]
    lexicon = read_lexicon(lexicon_path)
    references = [words_to_phones(c["supervisions"][0]["text"], lexicon)[0] for c in cuts]
    by_id = {r["id"]: r["phones"]["hypothesis"] for r in records}
    assert report["error_rates"]["per"] == pytest.approx(phone_error_rate(references, [by_id[c["id"]] for c in cuts]))


def test_per_never_depends_on_the_decoding_lexicon_and_data_dir_keeps_the_models_files(trained_run, tiny_synth,
                                                                                       tmp_path):
    from asr.evaluation.evaluation import EvaluateConfig, evaluate
    run, _ = trained_run
    checkpoint = str(run / "checkpoints" / "best.ckpt")
    folder, cuts = kaldi_folder(tiny_synth, tmp_path / "kaldi")
    # a decoding lexicon of the first utterance's words only, with its own LM: most words drop out
    first = cuts[0]["supervisions"][0]["text"]
    full = read_lexicon(tiny_synth / "lexicon.txt")
    small = write(tmp_path / "small.txt", "".join(f"{w} {' '.join(full[w][0])}\n" for w in sorted(set(first.split()))))
    small_lm = estimate_arpa([first], tmp_path / "small.arpa", order=2)
    common = dict(checkpoint=checkpoint, data_dir=str(folder), reference_lexicon=str(tiny_synth / "lexicon.txt"),
                  progress=False, decode_workers=1)
    greedy = evaluate(EvaluateConfig(**common, out=str(tmp_path / "g")))
    model_files = evaluate(EvaluateConfig(**common, decoder="lexicon", out=str(tmp_path / "m")))
    own_files = evaluate(EvaluateConfig(**common, decoder="lexicon", lexicon=str(small), lm=str(small_lm),
                                        out=str(tmp_path / "o")))
    assert greedy["error_rates"]["per"] == model_files["error_rates"]["per"] == own_files["error_rates"]["per"]
    assert own_files["out_of_vocabulary"]["lexicon"] > 0 == model_files["out_of_vocabulary"]["lexicon"]
    # data_dir scores other data, but the lexicon and LM stay the model's (not <data_dir>/asr_manifests')
    assert model_files["lexicon_decoder"]["lexicon"] == str(run / "decoding" / "lexicon.txt")
    assert model_files["lexicon_decoder"]["lm"] == str(run / "decoding" / "lm" / "3gram.arpa.gz")


def test_the_oov_rate_of_new_words_and_an_extra_lexicon_with_the_models_lm(trained_run, tiny_synth, tmp_path, capsys):
    from asr.evaluate import main
    run, _ = trained_run
    folder, cuts = kaldi_folder(tiny_synth, tmp_path / "kaldi", "zyzzyva")
    # counted by hand: every transcript gains one word the model's LM (and lexicon) lacks
    words = sum(len(c["supervisions"][0]["text"].split()) + 1 for c in cuts)
    extra = write(tmp_path / "extra.txt", "zyzzyva Z IH Z IY V AH\n")
    common = [f"checkpoint={run / 'checkpoints' / 'best.ckpt'}", f"data_dir={folder}", "decoder=lexicon",
              "progress=false", "decode_workers=1"]
    assert main(common + [f"out={tmp_path / 'plain'}"]) == 0
    plain = json.loads((tmp_path / "plain" / "results.json").read_text())
    assert plain["out_of_vocabulary"]["lm"] == pytest.approx(len(cuts) / words)
    assert plain["out_of_vocabulary"]["lexicon"] == pytest.approx(len(cuts) / words)
    assert plain["out_of_vocabulary"]["words_outside_lm"] == ["zyzzyva"]
    assert f"OOV {100 * len(cuts) / words:.2f}% (reference words not in the LM" in capsys.readouterr().out
    assert main(common + [f"extra_lexicon={extra}", f"out={tmp_path / 'extra'}"]) == 0
    added = json.loads((tmp_path / "extra" / "results.json").read_text())
    assert added["out_of_vocabulary"]["lm"] == pytest.approx(len(cuts) / words)
    assert added["out_of_vocabulary"]["lexicon"] == 0
    decoder = added["lexicon_decoder"]
    assert decoder["lexicon"] == str(run / "decoding" / "lexicon.txt") and decoder["extra_lexicon"] == str(extra)
    assert decoder["lexicon_words_outside_lm"] == 1
    assert decoder["lexicon_words"] == len(read_lexicon(tiny_synth / "lexicon.txt")) + 1
    assert "1 with the LM's <unk> probability" in capsys.readouterr().out


def test_a_lexicon_without_an_lm_is_a_usage_error_naming_both_fixes(trained_run, tiny_synth, tmp_path, capsys):
    from asr.evaluate import main as evaluate_main
    from asr.evaluation.evaluation import EvaluateConfig, evaluate
    from asr.transcribe import main as transcribe_main
    from asr.tune_lm import main as tune_main
    run, _ = trained_run
    checkpoint = f"checkpoint={run / 'checkpoints' / 'best.ckpt'}"
    lexicon = f"lexicon={tiny_synth / 'lexicon.txt'}"
    for command, extra in ((evaluate_main, ["decoder=lexicon"]), (transcribe_main, ["decoder=lexicon", str(tmp_path)]),
                           (tune_main, [])):
        assert command([checkpoint, lexicon, "progress=false", *extra]) == 2
        error = capsys.readouterr().err.strip().splitlines()
        assert len(error) == 1 and "lm=PATH" in error[0] and "lm=none" in error[0], error
    # lexicon= is no longer a way to phone references: decoder=greedy with it says where they come from
    assert evaluate_main([checkpoint, lexicon, "progress=false"]) == 2
    assert "reference_lexicon=" in capsys.readouterr().err
    # lm=none: the lexicon alone, said so in the report
    report = evaluate(EvaluateConfig(checkpoint=str(run / "checkpoints" / "best.ckpt"), decoder="lexicon",
                                     lexicon=str(tiny_synth / "lexicon.txt"), lm="none", out=str(tmp_path / "n"),
                                     progress=False, decode_workers=1))
    assert report["lexicon_decoder"]["lm"] is None and report["out_of_vocabulary"]["lm"] is None


def test_the_run_folder_keeps_the_corpus_lexicon_and_lm(trained_run, tiny_synth):
    run, _ = trained_run
    for name in ("lexicon.txt", "lm/3gram.arpa.gz"):
        assert (run / "decoding" / name).read_bytes() == (tiny_synth / name).read_bytes()
    assert not list((run / "decoding").rglob("*.partial"))


def test_the_models_files_are_found_from_any_folder_and_in_a_moved_run_folder(trained_run, tiny_synth, tmp_path,
                                                                            monkeypatch, capsys):
    import shutil
    from asr.model.decoding_files import model_decoding_files
    from asr.transcribe import main as transcribe
    run, _ = trained_run
    moved = tmp_path / "elsewhere" / "run"
    shutil.copytree(run, moved)
    somewhere = tmp_path / "somewhere"
    somewhere.mkdir()
    monkeypatch.chdir(somewhere)
    for folder in (run, moved):
        files = model_decoding_files(folder / "checkpoints" / "best.ckpt")
        assert (files.lexicon, files.lm) == (folder / "decoding" / "lexicon.txt",
                                             folder / "decoding" / "lm" / "3gram.arpa.gz")
    # the commands: asr.transcribe with the moved run's checkpoint, named relative to the working folder
    checkpoint = os.path.relpath(moved / "checkpoints" / "best.ckpt")
    assert transcribe([f"checkpoint={checkpoint}", str(tiny_synth / "audio" / "test"), "decoder=lexicon",
                       "progress=false"]) == 0
    assert all("\tlexicon: " in line for line in capsys.readouterr().out.splitlines())


def test_an_older_run_folder_finds_its_corpus_from_hydras_folder_or_its_own_parents(trained_run, tiny_synth, tmp_path,
                                                                                  monkeypatch):
    import shutil
    import yaml
    from asr.evaluation.decoding.evaluation import resolve_settings
    from asr.model.decoding_files import model_decoding_files

    def older_run(where: Path, root: str, hydra_cwd: Path | None = None) -> Path:
        """A copy of the run as asr.train made them before run folders kept decoding/: data.root as
        given on the command line (relative), Hydra's record of the working folder."""
        shutil.copytree(trained_run[0], where, ignore=shutil.ignore_patterns("decoding"))
        config = yaml.safe_load((where / "config.yaml").read_text())
        config["data"]["root"] = root
        (where / "config.yaml").write_text(yaml.safe_dump(config))
        if hydra_cwd is not None:
            (where / ".hydra").mkdir(exist_ok=True)
            (where / ".hydra" / "hydra.yaml").write_text(yaml.safe_dump({"hydra": {"runtime": {"cwd": str(hydra_cwd)}}}))
        return where / "checkpoints" / "best.ckpt"

    unrelated = tmp_path / "unrelated"
    unrelated.mkdir()
    monkeypatch.chdir(unrelated)
    # trained in tiny_synth's parent folder with data.root=<its name>
    checkpoint = older_run(tmp_path / "a" / "run", tiny_synth.name, hydra_cwd=tiny_synth.parent)
    files = model_decoding_files(checkpoint)
    assert (files.lexicon, files.lm) == (tiny_synth / "lexicon.txt", tiny_synth / "lm" / "3gram.arpa.gz")
    # a repository moved as a whole: runs/<preset>/<time> beside data/<corpus>, no Hydra record
    repository = tmp_path / "repository"
    (repository / "data").mkdir(parents=True)
    os.symlink(tiny_synth, repository / "data" / "corpus")
    checkpoint = older_run(repository / "runs" / "synth_full" / "t0", "data/corpus")
    assert model_decoding_files(checkpoint).lexicon == repository / "data" / "corpus" / "lexicon.txt"
    # nowhere to be found: the message lists every folder it looked in
    checkpoint = older_run(tmp_path / "b" / "run", "data/gone")
    files = model_decoding_files(checkpoint)
    assert files.lexicon is None
    with pytest.raises(LexiconFileError) as raised:
        resolve_settings(None, None, files)
    message = str(raised.value)
    for folder in (tmp_path / "b" / "run" / "decoding", tmp_path / "b" / "data" / "gone", unrelated / "data" / "gone"):
        assert str(folder) in message
    assert "lexicon=PATH" in message and "\n" not in message


def test_tune_lm_prints_a_grid_and_refuses_the_test_split(trained_run, tmp_path, capsys):
    from asr.tune_lm import main
    run, _ = trained_run
    checkpoint = f"checkpoint={run / 'checkpoints' / 'best.ckpt'}"
    assert main([checkpoint, "split=test", "progress=false"]) == 2
    assert "test split" in capsys.readouterr().err
    assert main([checkpoint, "split=dev", "lm_weights=[0,1]", "word_scores=[0,1]",
                 f"out={tmp_path / 'tune.json'}"]) == 0
    printed = capsys.readouterr()
    assert "best: lm_weight=" in printed.out
    assert "WER" not in printed.err     # with progress: a bar, not a second copy of the table's numbers
    report = json.loads((tmp_path / "tune.json").read_text())
    assert len(report["grid"]) == 4 and report["best"]["wer"] == min(row["wer"] for row in report["grid"])


def test_cross_matrix_adds_a_lexicon_wer_table(trained_run, tmp_path):
    from asr import cross_matrix
    run, _ = trained_run
    args = cross_matrix.build_parser().parse_args([str(run / "checkpoints" / "best.ckpt"), "--specs", "full",
                                                   "--decoder", "lexicon", "--out", str(tmp_path / "m")])
    args.data = {}
    matrix = cross_matrix.run(args, progress=lambda line: None)
    cell = matrix["rows"][0]["cells"][next(iter(matrix["rows"][0]["cells"]))]
    assert cell["wer_lexicon"] is not None
    assert "WER (lexicon + LM)" in (tmp_path / "m" / "matrix.md").read_text()


def test_bad_lexicon_in_the_command_is_one_line_and_exit_status_2(trained_run, tmp_path, capsys):
    from asr.evaluate import main
    run, _ = trained_run
    status = main([f"checkpoint={run / 'checkpoints' / 'best.ckpt'}", "decoder=lexicon",
                   f"lexicon={tmp_path / 'missing.txt'}", "lm=none", "progress=false", f"out={tmp_path / 'x'}"])
    error = capsys.readouterr().err.strip().splitlines()
    assert status == 2 and len(error) == 1 and "missing.txt" in error[0] and "does not exist" in error[0]


def test_a_corpus_lm_and_cmudict_are_installed_lowercased_and_restricted_to_the_lm(tmp_path):
    from recipes.decoding_files import install_decoding_files
    cmudict = write(tmp_path / "cmudict", ";;; CMUdict\nCAT  K AE1 T\nCAT(2)  K AA1 T\nDOG  D AO1 G\nZEBRA  Z IY1 B R AH0\n")
    lm = estimate_arpa(["CAT DOG", "DOG CAT"], tmp_path / "upper.arpa.gz", order=2)
    (tmp_path / "upper.arpa.gz").write_bytes(gzip.compress(gzip.decompress(lm.read_bytes()).replace(b"<unk>", b"<UNK>")))
    done = install_decoding_files(tmp_path / "corpus", cmudict, lm)
    assert done["lexicon_words"] == 2
    assert read_lexicon(tmp_path / "corpus" / "lexicon.txt") == {"cat": [("K", "AE", "T"), ("K", "AA", "T")],
                                                                 "dog": [("D", "AO", "G")]}
    vocabulary, _ = read_arpa_vocabulary(tmp_path / "corpus" / "lm" / "3gram.arpa.gz")
    assert vocabulary == {"<s>", "</s>", "<unk>", "cat", "dog"}
    LexiconDecoder(PHONES, LexiconDecoderSettings(lexicon=str(tmp_path / "corpus" / "lexicon.txt"),
                                                  lm=str(tmp_path / "corpus" / "lm" / "3gram.arpa.gz")))
    with pytest.raises(LanguageModelError, match="not a usable ARPA LM"):
        install_decoding_files(tmp_path / "other", None, write(tmp_path / "x.arpa", "words\n"))
    assert not (tmp_path / "other" / "lm" / "3gram.arpa.gz").exists()


def test_transcribe_with_the_lexicon_decoder_gives_evaluates_words(trained_run, tiny_synth, tmp_path, capsys):
    from asr.evaluation.evaluation import EvaluateConfig, evaluate
    from asr.core.exit_status import SUCCESS
    from asr.transcribe import main as transcribe
    run, _ = trained_run
    checkpoint = str(run / "checkpoints" / "best.ckpt")
    evaluate(EvaluateConfig(checkpoint=checkpoint, split="test", decoder="lexicon", out=str(tmp_path / "e"),
                            progress=False))
    expected = {r["id"]: r["lexicon"]["hypothesis"]
                for r in map(json.loads, (tmp_path / "e" / "hypotheses.jsonl").read_text().splitlines())}
    # the lexicon and LM default to the training corpus's, found through the checkpoint's run folder
    assert transcribe([f"checkpoint={checkpoint}", str(tiny_synth / "audio" / "test"), "decoder=lexicon",
                       f"out={tmp_path / 'out.jsonl'}", "progress=false"]) == SUCCESS
    records = [json.loads(line) for line in (tmp_path / "out.jsonl").read_text().splitlines()]
    assert {Path(r["file"]).stem: r["lexicon"]["hypothesis"] for r in records} == expected
    assert all(r["lexicon"]["head"] == "phones" for r in records)
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == len(expected) and all("\tlexicon: " in line for line in lines)
    assert transcribe([f"checkpoint={checkpoint}", str(tiny_synth / "audio" / "test"), "decoder=lexicon",
                       f"lexicon={tmp_path / 'missing.txt'}", "lm=none", "progress=false"]) == 2
    error = capsys.readouterr().err
    assert "missing.txt" in error and "does not exist" in error

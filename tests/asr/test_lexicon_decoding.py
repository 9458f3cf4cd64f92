"""Lexicon + n-gram LM decoding (asr.decoding): the decoder on hand-made emissions, the modified
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

from asr.data.tokenizers import build_tokenizer
from asr.decoding.lexicon import LexiconFileError, read_lexicon, words_to_phones
from asr.decoding.lexicon_decoder import LexiconDecoder, LexiconDecoderSettings, ParallelLexiconDecoder
from asr.decoding.ngram import (LanguageModelError, arpa_text, discounts, estimate_arpa,
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
    lm_without_bird = estimate_arpa(["cat dog"], folder / "small.arpa", order=2)
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
        "LM missing lexicon words": ({"lexicon": str(good_lexicon), "lm": str(lm_without_bird)}, LanguageModelError,
                                     ["lacks 1 of the lexicon's 3 words", "'bird'", "restrict_lexicon=true"]),
    }


def test_each_bad_input_is_one_clear_message(tmp_path):
    for name, (settings, error, says) in bad_inputs(tmp_path).items():
        with pytest.raises(error) as raised:
            LexiconDecoder(PHONES, LexiconDecoderSettings(**settings))
        message = str(raised.value)
        assert "\n" not in message, name
        for part in says:
            assert part in message, (name, part, message)


def test_restrict_lexicon_decodes_only_the_words_the_lm_knows(tmp_path):
    settings, _, _ = bad_inputs(tmp_path)["LM missing lexicon words"]
    decoder = LexiconDecoder(PHONES, LexiconDecoderSettings(**settings, restrict_lexicon=True))
    assert "bird" not in decoder.words and "cat" in decoder.words


# ---- where it is used: asr.train's test line, asr.evaluate, asr.tune_lm, asr.cross_matrix -------------
@pytest.fixture(scope="module")
def trained_run(tiny_synth, tmp_path_factory) -> tuple[Path, dict]:
    """A tiny model trained on the tiny corpus, which ships a lexicon and an LM: the run's test
    results gain the lexicon decoder's WER."""
    from asr.train import train
    from tiny_runs import tiny_config
    run = tmp_path_factory.mktemp("lexicon_run")
    results = train(tiny_config(tiny_synth, "conf=synth_full"), run)
    return run, results


def test_training_ends_with_the_lexicon_wer_when_the_corpus_has_a_lexicon_and_lm(trained_run):
    run, results = trained_run
    assert 0 <= results["test"]["wer_lexicon"] and "cer_lexicon" in results["test"]
    report = json.loads((Path(results["test"]["lexicon_evaluation"]) / "results.json").read_text())
    assert report["decoder"] == "lexicon" and report["lexicon_decoder"]["head"] == "phones"
    assert report["error_rates"]["wer"] == results["test"]["wer_lexicon"]


def test_evaluate_with_the_lexicon_decoder_records_its_settings_and_scores_its_words(trained_run, tiny_synth, tmp_path):
    from asr.evaluate import EvaluateConfig, evaluate
    from asr.metrics import word_error_rate
    run, _ = trained_run
    checkpoint = str(run / "checkpoints" / "best.ckpt")
    report = evaluate(EvaluateConfig(checkpoint=checkpoint, decoder="lexicon", lm_weight=0.5, word_score=1.0,
                                     decode_workers=2, out=str(tmp_path / "e"), progress=False))
    settings = report["lexicon_decoder"]
    assert (settings["lm_weight"], settings["word_score"]) == (0.5, 1.0)
    assert settings["lexicon"] == str(tiny_synth / "lexicon.txt") and settings["lm"].endswith("3gram.arpa.gz")
    records = [json.loads(line) for line in (tmp_path / "e" / "hypotheses.jsonl").read_text().splitlines()]
    words = [r["lexicon"] for r in records]
    assert report["error_rates"]["wer"] == pytest.approx(
        word_error_rate([w["reference"] for w in words], [w["hypothesis"] for w in words]))
    lexicon = read_lexicon(tiny_synth / "lexicon.txt")
    assert all(word in lexicon for w in words for word in w["hypothesis"].split())
    assert "per" in report["error_rates"]                              # still from the phone head


def test_a_kaldi_directory_gets_a_per_from_the_lexicon(trained_run, tiny_synth, tmp_path):
    from asr.evaluate import EvaluateConfig, evaluate
    from asr.metrics import phone_error_rate
    run, _ = trained_run
    folder = tmp_path / "kaldi"
    folder.mkdir()
    with gzip.open(tiny_synth / "synth_cuts_test.jsonl.gz", "rt") as handle:
        cuts = [json.loads(line) for line in handle]
    (folder / "wav.scp").write_text("".join(f"{c['id']} {tiny_synth / c['recording']['sources'][0]['source']}\n"
                                            for c in cuts))
    (folder / "text").write_text("".join(f"{c['id']} {c['supervisions'][0]['text']} zyzzyva\n" for c in cuts))
    lexicon_path = tiny_synth / "lexicon.txt"
    report = evaluate(EvaluateConfig(checkpoint=str(run / "checkpoints" / "best.ckpt"), data_dir=str(folder),
                                     lexicon=str(lexicon_path), out=str(tmp_path / "k"), progress=False))
    assert report["words_missing_from_lexicon"] == ["zyzzyva"]
    records = [json.loads(line) for line in (tmp_path / "k" / "hypotheses.jsonl").read_text().splitlines()]
    lexicon = read_lexicon(lexicon_path)
    references = [words_to_phones(c["supervisions"][0]["text"], lexicon)[0] for c in cuts]
    by_id = {r["id"]: r["phones"]["hypothesis"] for r in records}
    assert report["error_rates"]["per"] == pytest.approx(phone_error_rate(references, [by_id[c["id"]] for c in cuts]))


def test_tune_lm_prints_a_grid_and_refuses_the_test_split(trained_run, tmp_path, capsys):
    from asr.tune_lm import main
    run, _ = trained_run
    checkpoint = f"checkpoint={run / 'checkpoints' / 'best.ckpt'}"
    assert main([checkpoint, "split=test", "progress=false"]) == 2
    assert "test split" in capsys.readouterr().err
    assert main([checkpoint, "split=dev", "lm_weights=[0,1]", "word_scores=[0,1]", "progress=false",
                 f"out={tmp_path / 'tune.json'}"]) == 0
    printed = capsys.readouterr().out
    assert "best: lm_weight=" in printed
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
                   f"lexicon={tmp_path / 'missing.txt'}", "progress=false", f"out={tmp_path / 'x'}"])
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
    from asr.evaluate import EvaluateConfig, evaluate
    from asr.exit_status import SUCCESS
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
                       f"lexicon={tmp_path / 'missing.txt'}", "progress=false"]) == 2
    assert "missing.txt" in capsys.readouterr().err

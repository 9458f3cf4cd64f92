"""python -m asr.lexicon: new words pronounced as the training corpus's were (espeak-ng and flite,
ARPABET_39), merged with a base lexicon, written whole; one clear message per bad input."""
from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from asr.evaluation.decoding.lexicon import read_lexicon
from asr.lexicon import main

needs_synthesisers = pytest.mark.skipif(not all(shutil.which(p) for p in ("espeak-ng", "flite")),
                                        reason="espeak-ng or flite not installed (apt-get install espeak-ng flite)")


def write(path: Path, text: str) -> Path:
    path.write_text(text)
    return path


@needs_synthesisers
def test_new_words_get_the_training_pronunciations_and_the_base_is_kept(tmp_path, capsys):
    # running text, normalised as transcripts: "Zebra," -> zebra, "BANANA-cat" -> banana cat
    text = write(tmp_path / "text.txt", "Zebra, BANANA-cat!\nthe zebra\n")
    base = write(tmp_path / "base.txt", ";;; CMUdict style\nCAT  K AA1 T\nDOG  D AO1 G\n")
    out = tmp_path / "made" / "lexicon.txt"
    assert main([str(text), "--base", str(base), "--out", str(out), "--no-progress"]) == 0
    lexicon = read_lexicon(out)
    # written by hand from CMUdict: what both synthesisers say for these words
    assert lexicon["zebra"] == [("Z", "IY", "B", "R", "AH")]
    assert lexicon["banana"] == [("B", "AH", "N", "AE", "N", "AH")]
    assert lexicon["the"] == [("DH", "AH")]
    # the base's words are kept as they are (cat is not pronounced again; dog is not in the text)
    assert lexicon["cat"] == [("K", "AA", "T")] and lexicon["dog"] == [("D", "AO", "G")]
    assert set(lexicon) == {"zebra", "banana", "the", "cat", "dog"}
    printed = capsys.readouterr().out
    assert f"{out}: 5 words, 2 from {base}, 3 new of the text's 4 distinct words" in printed
    assert not list(out.parent.glob("*.partial"))


@needs_synthesisers
def test_weak_forms_go_to_frequent_one_vowel_words_of_running_text_only(tmp_path):
    running = write(tmp_path / "running.txt", "a cat for a dog for\n")
    assert main([str(running), "--out", str(tmp_path / "running_lexicon.txt"), "--no-progress"]) == 0
    lexicon = read_lexicon(tmp_path / "running_lexicon.txt")
    assert lexicon["a"] == [("EY",), ("AH",)] and lexicon["for"] == [("F", "AO", "R"), ("F", "ER")]
    assert lexicon["cat"] == [("K", "AE", "T")]                       # said once: no weak form
    word_list = write(tmp_path / "words.txt", "a\nfor\n")
    assert main([str(word_list), "--out", str(tmp_path / "list_lexicon.txt"), "--no-progress"]) == 0
    assert read_lexicon(tmp_path / "list_lexicon.txt") == {"a": [("EY",)], "for": [("F", "AO", "R")]}
    assert main([str(running), "--weak-forms", "0", "--out", str(tmp_path / "none.txt"), "--no-progress"]) == 0
    assert read_lexicon(tmp_path / "none.txt")["a"] == [("EY",)]


def test_bad_inputs_are_one_line_and_exit_status_2(tmp_path, capsys):
    text = write(tmp_path / "text.txt", "hello\n")
    cases = {
        "missing text": ([str(tmp_path / "nope.txt")], ["nope.txt", "does not exist"]),
        "no words": ([str(write(tmp_path / "digits.txt", "2024 -- 42\n"))], ["no words in", "digits.txt"]),
        "not UTF-8": ([str(tmp_path / "latin1.txt")], ["latin1.txt", "UTF-8"]),
        "base in another phone set": ([str(text), "--base", str(write(tmp_path / "timit.txt", "hello HH AX L OW\n"))],
                                      ["timit.txt", "'AX'", "ARPABET_39"]),
        "missing base": ([str(text), "--base", str(tmp_path / "gone.txt")], ["gone.txt", "does not exist"]),
        "out is a folder": ([str(text), "--out", str(tmp_path)], ["is a folder"]),
    }
    (tmp_path / "latin1.txt").write_bytes("caf\xe9\n".encode("latin-1"))
    for name, (arguments, says) in cases.items():
        if "--out" not in arguments:
            arguments = arguments + ["--out", str(tmp_path / "out.txt")]
        assert main(arguments + ["--no-progress"]) == 2, name
        error = capsys.readouterr().err.strip().splitlines()
        assert len(error) == 1 and error[0].startswith("asr.lexicon: error: "), (name, error)
        for part in says:
            assert part in error[0], (name, part, error)
    assert not (tmp_path / "out.txt").exists()
    with pytest.raises(SystemExit) as raised:            # argparse: --out is required
        main([str(text)])
    assert raised.value.code == 2


def test_missing_synthesisers_are_named_with_their_package_and_exit_status_1(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("PATH", str(tmp_path / "empty_bin"))
    text = write(tmp_path / "text.txt", "hello\n")
    assert main([str(text), "--out", str(tmp_path / "out.txt"), "--no-progress"]) == 1
    error = capsys.readouterr().err
    assert "espeak-ng" in error and "flite" in error and "apt-get install" in error
    assert not (tmp_path / "out.txt").exists()
    # words the base already has need no synthesiser
    base = write(tmp_path / "base.txt", "hello HH AH L OW\n")
    assert main([str(text), "--base", str(base), "--out", str(tmp_path / "out.txt"), "--no-progress"]) == 0
    assert read_lexicon(tmp_path / "out.txt") == {"hello": [("HH", "AH", "L", "OW")]}

"""python -m asr.build_lm: the ARPA file is the project's estimator on the text normalised as
transcripts are, over the lexicon's vocabulary; the report counts by hand; bad input exits 2."""
from __future__ import annotations

import gzip
from pathlib import Path

import pytest

from asr.build_lm import main
from asr.evaluation.decoding.ngram import estimate_arpa, read_arpa_vocabulary


def write(path: Path, text: str) -> Path:
    path.write_text(text)
    return path


def test_the_lm_is_estimate_arpa_on_the_normalised_text_over_the_lexicons_words(tmp_path, capsys):
    text = write(tmp_path / "text.txt", "The cat sat.\n\n  THE DOG'S bone, 2024!\nthe cat-flap\n")
    more = tmp_path / "more.txt.gz"
    more.write_bytes(gzip.compress(b"A zebra sat\n"))
    lexicon = write(tmp_path / "lexicon.txt", "the DH AH\ncat K AE T\nsat S AE T\nflap F L AE P\nemu IY M Y UW\n")
    out = tmp_path / "lm" / "own.arpa.gz"
    assert main([str(text), str(more), "--lexicon", str(lexicon), "--order", "3", "--out", str(out),
                 "--no-progress"]) == 0
    # normalised by hand: lowercase a-z and apostrophes, anything else splits words, empty lines go
    sentences = ["the cat sat", "the dog's bone", "the cat flap", "a zebra sat"]
    expected = estimate_arpa(sentences, tmp_path / "expected.arpa", order=3,
                             vocabulary=["cat", "emu", "flap", "sat", "the"])
    assert gzip.decompress(out.read_bytes()).decode() == expected.read_text()
    vocabulary, counts = read_arpa_vocabulary(out)
    assert "emu" in vocabulary and len(counts) == 3
    printed = capsys.readouterr().out
    # 12 words in 4 sentences; outside the 5-word lexicon: dog's, bone, a, zebra (4 distinct, 4 of 12 words)
    assert f"3-gram LM from 4 sentences, 12 words; vocabulary {len(vocabulary)}" in printed
    assert f"1-grams {counts[0]}, 2-grams {counts[1]}, 3-grams {counts[2]}" in printed
    assert "5 words, 1 of them not in the text" in printed
    assert f"4 distinct words of the text ({100 * 4 / 12:.2f}% of its words) are not in the lexicon" in printed
    assert not list(out.parent.glob("*.partial"))


def test_without_a_lexicon_the_vocabulary_is_the_texts(tmp_path):
    text = write(tmp_path / "text.txt", "one two\ntwo three\n")
    assert main([str(text), "--order", "2", "--out", str(tmp_path / "lm.arpa"), "--no-progress"]) == 0
    expected = estimate_arpa(["one two", "two three"], tmp_path / "expected.arpa", order=2)
    assert (tmp_path / "lm.arpa").read_text() == expected.read_text()


def test_text_from_stdin(tmp_path, monkeypatch):
    import io
    monkeypatch.setattr("sys.stdin", io.StringIO("One two.\nTwo, three!\n"))
    assert main(["-", "--order", "2", "--out", str(tmp_path / "lm.arpa"), "--no-progress"]) == 0
    expected = estimate_arpa(["one two", "two three"], tmp_path / "expected.arpa", order=2)
    assert (tmp_path / "lm.arpa").read_text() == expected.read_text()


@pytest.mark.parametrize("case", ["empty text", "order 1", "order 5", "missing text", "missing lexicon",
                                  "text is a folder", "out is a folder"])
def test_bad_input_is_one_line_and_exit_status_2(case, tmp_path, capsys):
    text = write(tmp_path / "text.txt", "one two\n")
    arguments, says = {
        "empty text": ([str(write(tmp_path / "empty.txt", "\n-- 42 --\n"))], ["no words in", "empty.txt"]),
        "order 1": ([str(text), "--order", "1"], ["--order 1", "2 to 4"]),
        "order 5": ([str(text), "--order", "5"], ["--order 5", "2 to 4"]),
        "missing text": ([str(tmp_path / "nope.txt")], ["nope.txt", "does not exist"]),
        "missing lexicon": ([str(text), "--lexicon", str(tmp_path / "gone.txt")], ["gone.txt", "does not exist"]),
        "text is a folder": ([str(tmp_path)], ["is a folder"]),
        "out is a folder": ([str(text), "--out", str(tmp_path)], ["is a folder"]),
    }[case]
    if "--out" not in arguments:
        arguments = arguments + ["--out", str(tmp_path / "lm.arpa")]
    assert main(arguments + ["--no-progress"]) == 2
    error = capsys.readouterr().err.strip().splitlines()
    assert len(error) == 1 and error[0].startswith("asr.build_lm: error: "), error
    for part in says:
        assert part in error[0], (part, error)
    assert not (tmp_path / "lm.arpa").exists()

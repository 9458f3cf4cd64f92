"""Random files through the readers of files a user gives (hypothesis): a cuts manifest (load_cuts), a
Kaldi folder (read_kaldi_data_dir), a lexicon (read_lexicon) and an ARPA LM (read_arpa_vocabulary, what
reads it before KenLM). Each must give a parsed result or its own error class with a one-line message
naming the file; any other exception, a crash or a hang fails the test.

Random bytes, random lines, and a valid file with one field changed to a random value (what reaches the
checks past the parser). A fixed (derandomized) search without an example database, so CI runs the
same examples every time and writes nothing into the checkout; the deadline trips only on a hang.
"""
from __future__ import annotations

import gzip
import json
from datetime import timedelta
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from asr.data.corpus.kaldi_dir import KaldiDataDirError, read_kaldi_data_dir
from asr.data.corpus.manifests import ManifestError, load_cuts
from asr.evaluation.decoding.lexicon import LexiconFileError, read_lexicon
from asr.evaluation.decoding.ngram import LanguageModelError, read_arpa_vocabulary

# Each example reads one small file: milliseconds. The whole file stays a few seconds on 2 shared cores.
FUZZ = dict(derandomize=True, database=None, deadline=timedelta(seconds=5), max_examples=300,
            suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])

# Lines as a user's editor or a broken download could leave them: any characters (controls, NUL,
# surrogate-free Unicode) or any bytes.
any_text_line = st.text(st.characters(exclude_categories=("Cs",)), max_size=60)
any_bytes = st.binary(max_size=400)


def one_line(error: Exception, path: Path) -> None:
    message = str(error)
    assert "\n" not in message and "\r" not in message, message
    assert str(path) in message, message


# ---- cuts manifests ---------------------------------------------------------------------------------
A_CUT = {"id": "u1", "start": 0.0, "duration": 1.0, "channel": 0, "type": "MonoCut",
         "supervisions": [{"id": "u1", "recording_id": "r1", "start": 0.0, "duration": 1.0, "channel": 0,
                           "text": "hello world", "speaker": "s1", "custom": {"phones": "HH AH L OW"}}],
         "recording": {"id": "r1", "sources": [{"type": "file", "channels": [0], "source": "audio/r1.flac"}],
                       "sampling_rate": 16000, "num_samples": 16000, "duration": 1.0, "channel_ids": [0]}}
JSON_VALUES = st.recursive(st.none() | st.booleans() | st.integers() | st.floats() | any_text_line,
                           lambda inner: (st.lists(inner, max_size=3)
                                          | st.dictionaries(any_text_line, inner, max_size=3)),
                           max_leaves=6)
# (path into the cut, as keys and list indexes)
CUT_FIELDS = [("id",), ("start",), ("duration",), ("type",), ("supervisions",), ("supervisions", 0, "text"),
              ("supervisions", 0, "custom"), ("supervisions", 0, "duration"), ("recording",), ("recording", "id"),
              ("recording", "sources"), ("recording", "sources", 0, "type"), ("recording", "sources", 0, "source"),
              ("recording", "sampling_rate"), ("recording", "num_samples"), ("recording", "duration"),
              ("recording", "channel_ids")]


def with_field(cut: dict, path: tuple, value) -> dict:
    changed = json.loads(json.dumps(cut))
    holder = changed
    for key in path[:-1]:
        holder = holder[key]
    holder[path[-1]] = value
    return changed


def read_manifest(root: Path, content: bytes):
    manifest = root / "mine_cuts_test.jsonl.gz"
    manifest.write_bytes(content)
    try:
        return load_cuts(root, "mine", "test", need_phones=True)
    except ManifestError as error:
        one_line(error, manifest)


@settings(**FUZZ)
@given(field=st.sampled_from(CUT_FIELDS), value=JSON_VALUES)
def test_a_manifest_with_one_field_changed_loads_or_is_a_manifest_error(tmp_path, field, value):
    line = json.dumps(with_field(A_CUT, field, value))   # NaN and infinities as Python's json writes them
    read_manifest(tmp_path, gzip.compress((line + "\n").encode()))


@settings(**FUZZ)
@given(lines=st.lists(any_text_line, max_size=4), raw=any_bytes, gzipped=st.booleans())
def test_random_manifest_lines_or_bytes_are_a_manifest_error(tmp_path, lines, raw, gzipped):
    read_manifest(tmp_path, gzip.compress("\n".join(lines).encode()) if gzipped else raw)


# ---- Kaldi folders ------------------------------------------------------------------------------------
def kaldi_line(fields: int):
    """A line of `fields` fields (ids from a small set, so that ids repeat and meet across files) or any text."""
    word = st.sampled_from(["a", "b", "c", "0", "1.5", "-1", "nan", "x |", "w\x00x", "\x1b[31m", "é"]) | any_text_line
    return st.lists(word, min_size=0, max_size=fields + 1).map(" ".join) | any_text_line


def kaldi_file(fields: int):
    lines = st.lists(kaldi_line(fields), max_size=5).map(lambda ls: ("\n".join(ls) + "\n").encode())
    return lines | any_bytes


@settings(**FUZZ)
@given(wav_scp=kaldi_file(2), text=kaldi_file(3), utt2spk=st.none() | kaldi_file(2),
       segments=st.none() | kaldi_file(4), allow_commands=st.booleans())
def test_a_random_kaldi_folder_reads_or_is_a_kaldi_error(tmp_path, wav_scp, text, utt2spk, segments, allow_commands):
    folder = tmp_path / "kaldi"
    folder.mkdir(exist_ok=True)
    for name, content in (("wav.scp", wav_scp), ("text", text), ("utt2spk", utt2spk), ("segments", segments)):
        (folder / name).unlink(missing_ok=True)
        if content is not None:
            (folder / name).write_bytes(content)
    try:
        read = read_kaldi_data_dir(folder, require_utt2spk=False, allow_commands=allow_commands)
    except KaldiDataDirError as error:
        one_line(error, folder)
        return
    # what was read is what the files say: each utterance's words are its one line of text, as written
    lines = [line.split() for line in text.decode("utf-8-sig").splitlines() if line.strip()]
    for utterance in read.utterances:
        (words,) = [fields[1:] for fields in lines if fields[0] == utterance.id]   # on one line only
        assert list(utterance.words) == words
        assert all(character.isprintable() or character.isspace() for word in words for character in word)


# ---- lexicons -----------------------------------------------------------------------------------------
lexicon_line = (st.lists(st.sampled_from(["hello", "HH", "AH0", "L", "OW1", "#", ";;;", "a(2)"]) | any_text_line,
                         max_size=5).map(" ".join))


@settings(**FUZZ)
@given(lines=st.lists(lexicon_line | any_text_line, max_size=6), raw=any_bytes, as_bytes=st.booleans())
def test_a_random_lexicon_reads_or_is_a_lexicon_error(tmp_path, lines, raw, as_bytes):
    path = tmp_path / "lexicon.txt"
    path.write_bytes(raw if as_bytes else "\n".join(lines).encode())
    try:
        lexicon = read_lexicon(path)
    except LexiconFileError as error:
        one_line(error, path)
        return
    assert lexicon and all(spellings and all(spelling for spelling in spellings) for spellings in lexicon.values())


# ---- ARPA language models -----------------------------------------------------------------------------
AN_ARPA = ["\\data\\", "ngram 1=3", "ngram 2=1", "", "\\1-grams:", "-1.0 <s> -0.5", "-0.5 </s>", "-0.7 hello -0.3",
           "", "\\2-grams:", "-0.2 <s> hello", "", "\\end\\"]
arpa_line = st.sampled_from(AN_ARPA + ["ngram 1=", "ngram x=1", "-inf hello", "nan", "\\3-grams:"]) | any_text_line


@settings(**FUZZ)
@given(changes=st.lists(st.tuples(st.integers(0, len(AN_ARPA) - 1), arpa_line), max_size=3),
       raw=any_bytes, kind=st.sampled_from(["edited", "bytes", "gzip-of-bytes", "gzip-header-then-bytes"]))
def test_a_random_arpa_file_reads_or_is_a_language_model_error(tmp_path, changes, raw, kind):
    lines = list(AN_ARPA)
    for index, line in changes:
        lines[index] = line
    text = ("\n".join(lines) + "\n").encode()
    content = {"edited": text, "bytes": raw, "gzip-of-bytes": gzip.compress(raw),
               # a damaged download: a gzip header, then anything
               "gzip-header-then-bytes": gzip.compress(text)[:10] + raw}[kind]
    path = tmp_path / ("lm.arpa.gz" if kind.startswith("gzip") else "lm.arpa")
    path.write_bytes(content)
    try:
        words, counts = read_arpa_vocabulary(path)
    except LanguageModelError as error:
        one_line(error, path)
        return
    assert len(words) == counts[0]


def test_the_unchanged_files_read(tmp_path):
    """The fuzzed files' starting points are valid: the tests above reach past the first check."""
    (tmp_path / "audio").mkdir()
    assert len(read_manifest(tmp_path, gzip.compress((json.dumps(A_CUT) + "\n").encode()))) == 1
    path = tmp_path / "lm.arpa"
    path.write_text("\n".join(AN_ARPA) + "\n")
    assert read_arpa_vocabulary(path) == ({"<s>", "</s>", "hello"}, [3, 1])

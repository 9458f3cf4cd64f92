"""A corpus's lexicon and n-gram LM for lexicon decoding, put where asr.train finds them.

asr.train keeps `<data.root>/lexicon.txt` and `<data.root>/lm/3gram.arpa.gz` in each run folder
(`decoding/`), and `asr.evaluate decoder=lexicon` (and asr.train's closing test line) decode with
them unless told otherwise. Corpora that ship an LM (WSJ's 20k
trigram, LibriSpeech's OpenSLR 11 ARPA files) give them to their recipe by path; this module
writes the two files from them:

- the LM: an ARPA file, plain, gzipped, or compressed with Unix `compress` (WSJ's `.z`), copied
  with its words lowercased (our transcripts are lowercase; <UNK> becomes <unk>);
- the lexicon: CMUdict-format pronunciations, every one of a word kept, stress removed, words
  lowercased, restricted to the LM's vocabulary (WSJ's closed 20k vocabulary: CMUdict has 130k
  words, the LM 20k; a word the LM cannot score would never be decoded anyway).

Both are written atomically and kept when present (delete them to rebuild).
"""
from __future__ import annotations

import gzip
import os
import subprocess
from pathlib import Path

from asr.evaluation.decoding.lexicon import read_lexicon, write_lexicon
from asr.evaluation.decoding.ngram import LanguageModelError, read_arpa_vocabulary

LEXICON_FILE, LM_FILE = "lexicon.txt", "lm/3gram.arpa.gz"


def _arpa_lines(path: Path):
    if not path.is_file():
        raise LanguageModelError(f"LM file {path} does not exist")
    if path.suffix in (".z", ".Z"):
        process = subprocess.Popen(["gzip", "-dc", str(path)], stdout=subprocess.PIPE, text=True)
        yield from process.stdout
        if process.wait() != 0:
            raise LanguageModelError(f"LM file {path}: `gzip -dc` cannot decompress it")
        return
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt", encoding="utf-8", errors="replace") as handle:
        yield from handle


def install_decoding_files(out_dir: str | Path, lexicon: str | Path | list | None, lm: str | Path | None) -> dict:
    """Writes out_dir/lm/3gram.arpa.gz (from `lm`) and out_dir/lexicon.txt (from `lexicon`, one
    file or several, a later one overriding a word), each only when missing; returns what it did."""
    out_dir = Path(out_dir)
    lm_out, lexicon_out = out_dir / LM_FILE, out_dir / LEXICON_FILE
    done: dict = {}
    if lm is not None and not lm_out.is_file():
        lm_out.parent.mkdir(parents=True, exist_ok=True)
        partial = lm_out.with_name(lm_out.name + ".partial")
        with gzip.open(partial, "wt", encoding="utf-8", compresslevel=5) as handle:
            for line in _arpa_lines(Path(lm)):
                handle.write(line.lower())
        try:
            read_arpa_vocabulary(partial, gzipped=True)   # refuses a file that is not ARPA before installing it
        except LanguageModelError as error:
            partial.unlink()
            raise LanguageModelError(f"{lm} is not a usable ARPA LM: {str(error).split(': ', 1)[-1]}") from None
        os.replace(partial, lm_out)
        done["lm"] = str(lm_out)
    if lexicon is not None and not lexicon_out.is_file():
        pronunciations: dict = {}
        for path in ([lexicon] if isinstance(lexicon, (str, Path)) else lexicon):
            pronunciations.update(read_lexicon(path))
        if lm_out.is_file():
            vocabulary, _ = read_arpa_vocabulary(lm_out)
            pronunciations = {word: s for word, s in pronunciations.items() if word in vocabulary}
        write_lexicon(pronunciations, lexicon_out)
        done["lexicon"] = str(lexicon_out)
        done["lexicon_words"] = len(pronunciations)
    return done

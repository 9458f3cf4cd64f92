"""The synthetic corpus's pronunciation lexicon and word trigram LM, for lexicon decoding.

- ``lexicon.txt``: every word of the corpus's transcripts (train, dev and test: a closed
  vocabulary, as in WSJ's standard 20k setup), with the pronunciations the synthesisers give the
  word spoken alone: espeak-ng en-us, espeak-ng en-us-nyc and flite (CMUdict's cmulex), mapped to
  ARPABET_39 by ``recipes.synth.phonemes``; distinct ones only. Inside a sentence both
  synthesisers reduce short function words ("a" EY -> AH, "for" F AO R -> F ER): the
  WEAK_FORM_WORDS most frequent one-vowel words of the training text also get their weak form
  (the vowel -> AH, a vowel + R -> ER), as CMUdict lists for such words.
- ``lm/3gram.arpa.gz``: a modified Kneser-Ney trigram (``asr.decoding.ngram``) estimated on the
  *training* transcripts only, with the whole lexicon as its vocabulary (so dev/test words that
  training never saw get the interpolated unigram share, as in a closed-vocabulary LM).

Both are written atomically; an existing file is kept, so a rerun finishes what is missing.
"""
from __future__ import annotations

import gzip
import json
import os
import subprocess
from pathlib import Path

from asr.decoding.lexicon import write_lexicon
from asr.decoding.ngram import estimate_arpa
from recipes.synth.phonemes import UnmappablePhonemeError, espeak_to_arpabet, flite_to_arpabet
from recipes.synth.voices import SynthesisError, check_synthesisers

LEXICON_FILE = "lexicon.txt"
LM_FILE = "lm/3gram.arpa.gz"
LM_ORDER = 3
ESPEAK_VOICES = ("en-us", "en-us-nyc")
_CHUNK = 200
WEAK_FORM_WORDS = 100
VOWELS = {"AA", "AE", "AH", "AO", "AW", "AY", "EH", "ER", "EY", "IH", "IY", "OW", "OY", "UH", "UW"}


def transcripts(out_dir: Path, corpus: str, split: str) -> list[str]:
    """The word transcripts of one split, from its supervision manifest."""
    path = out_dir / f"{corpus}_supervisions_{split}.jsonl.gz"
    with gzip.open(path, "rt", encoding="utf-8") as handle:
        return [json.loads(line)["text"] for line in handle if line.strip()]


def _run(command: list[str], text: str | None = None) -> str:
    try:
        return subprocess.run(command, input=text, capture_output=True, text=True, check=True,
                              env={**os.environ, "LC_ALL": "C.UTF-8"}).stdout
    except FileNotFoundError:
        check_synthesisers()           # names every missing program and its Debian package
        raise
    except subprocess.CalledProcessError as error:
        raise SynthesisError(f"`{' '.join(command[:4])} ...` failed with exit status {error.returncode}: "
                             f"{error.stderr.strip()[-300:]}") from None


def _espeak_words(words: list[str], voice: str) -> list[str | None]:
    """espeak-ng's phoneme text of each word said alone (one output line per input line)."""
    lines = _run(["espeak-ng", "-v", voice, "-q", "-x", "--sep= "], "\n".join(words) + "\n").splitlines()
    lines = [line for line in lines if line.strip()]
    if len(lines) == len(words):
        return lines
    return [_run(["espeak-ng", "-v", voice, "-q", "-x", "--sep= ", word]) for word in words]


def _flite_words(words: list[str]) -> list[str | None]:
    """flite's segments of each word said alone: words joined by full stops give pau-separated groups."""
    groups = [g.strip() for g in _run(["flite", "-ps", "-t", ". ".join(words) + ".", "-o", "none"]).split("pau")]
    groups = [g for g in groups if g]
    if len(groups) == len(words):
        return groups
    return [_run(["flite", "-ps", "-t", word + ".", "-o", "none"]) for word in words]


def synthesiser_pronunciations(words: list[str]) -> tuple[dict[str, list[tuple[str, ...]]], list[str]]:
    """(word -> distinct ARPABET_39 pronunciations, words no synthesiser pronounces in ARPAbet)."""
    lexicon: dict[str, list[tuple[str, ...]]] = {word: [] for word in words}
    for start in range(0, len(words), _CHUNK):
        chunk = words[start:start + _CHUNK]
        outputs = [(espeak_to_arpabet, _espeak_words(chunk, voice)) for voice in ESPEAK_VOICES]
        outputs.append((flite_to_arpabet, _flite_words(chunk)))
        for to_arpabet, texts in outputs:
            for word, text in zip(chunk, texts):
                try:
                    phones = tuple(to_arpabet(text))
                except UnmappablePhonemeError:
                    continue
                if phones and phones not in lexicon[word]:
                    lexicon[word].append(phones)
    missing = [word for word, spellings in lexicon.items() if not spellings]
    return {word: spellings for word, spellings in lexicon.items() if spellings}, missing


def weak_form(phones: tuple[str, ...]) -> tuple[str, ...] | None:
    """The reduced form of a one-vowel pronunciation: its vowel -> AH, or vowel + R -> ER."""
    vowels = [i for i, phone in enumerate(phones) if phone in VOWELS]
    if len(vowels) != 1:
        return None
    i = vowels[0]
    if phones[i] in ("AH", "ER"):      # already reduced
        return phones
    if i + 1 < len(phones) and phones[i + 1] == "R":
        return phones[:i] + ("ER",) + phones[i + 2:]
    return phones[:i] + ("AH",) + phones[i + 1:]


def add_weak_forms(lexicon: dict[str, list[tuple[str, ...]]], train_texts: list[str],
                   count: int = WEAK_FORM_WORDS) -> None:
    """Adds the weak form of the `count` most frequent one-vowel training words (in place)."""
    from collections import Counter
    frequencies = Counter(word for text in train_texts for word in text.split())
    frequent = [word for word, _ in frequencies.most_common()
                if word in lexicon and all(weak_form(s) for s in lexicon[word])][:count]
    for word in frequent:
        for spelling in list(lexicon[word]):
            reduced = weak_form(spelling)
            if reduced not in lexicon[word]:
                lexicon[word].append(reduced)


def write_lexicon_and_lm(out_dir: str | Path, corpus: str = "synth", splits=("train", "dev", "test"),
                         train_split: str = "train") -> dict:
    """Writes out_dir/lexicon.txt and out_dir/lm/3gram.arpa.gz where missing; returns what it did."""
    out_dir = Path(out_dir)
    lexicon_path, lm_path = out_dir / LEXICON_FILE, out_dir / LM_FILE
    summary: dict = {"lexicon": str(lexicon_path), "lm": str(lm_path)}
    texts = {split: transcripts(out_dir, corpus, split) for split in splits}
    vocabulary = sorted({word for split_texts in texts.values() for text in split_texts for word in text.split()})
    if not lexicon_path.is_file():
        lexicon, unpronounced = synthesiser_pronunciations(vocabulary)
        add_weak_forms(lexicon, texts[train_split])
        write_lexicon(lexicon, lexicon_path)
        summary.update(lexicon_words=len(lexicon), unpronounced_words=unpronounced)
    if not lm_path.is_file():
        from asr.decoding.lexicon import read_lexicon
        words = sorted(read_lexicon(lexicon_path))
        estimate_arpa(texts[train_split], lm_path, order=LM_ORDER, vocabulary=words)
        summary.update(lm_order=LM_ORDER, lm_training_sentences=len(texts[train_split]))
    return summary

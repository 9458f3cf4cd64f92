"""Pronunciations of words in the training phone set, from the synthesisers that made the training data.

The built-in corpus's phone targets are what espeak-ng and flite said (asr.text.synthesiser_phonemes
maps them to ARPABET_39), so a word's pronunciations for decoding or for the phone references of new
recordings come from the same programs: each word spoken alone by espeak-ng en-us, espeak-ng
en-us-nyc and flite (CMUdict's cmulex), mapped to ARPABET_39, distinct ones only. Inside a sentence
both synthesisers reduce short function words ("a" EY -> AH, "for" F AO R -> F ER); `add_weak_forms`
gives the most frequent one-vowel words of a text their weak form too, as CMUdict lists for them.

Used by the synth recipe's lexicon, by asr.evaluation.decoding.lexicon_builder (`python -m asr.lexicon`:
a user's new words) and by recipes that need phone references for real speech (recipes/asterisk).
"""
from __future__ import annotations

import os
import shutil
import subprocess
from collections import Counter

from asr.text.synthesiser_phonemes import UnmappablePhonemeError, espeak_to_arpabet, flite_to_arpabet

ESPEAK_VOICES = ("en-us", "en-us-nyc")
WEAK_FORM_WORDS = 100
VOWELS = {"AA", "AE", "AH", "AO", "AW", "AY", "EH", "ER", "EY", "IH", "IY", "OW", "OY", "UH", "UW"}
# program -> the Debian package that provides it
PRONOUNCING_PROGRAMS = {"espeak-ng": "espeak-ng", "flite": "flite"}
_CHUNK = 200   # words per synthesiser run


class PronunciationError(RuntimeError):
    """A synthesiser is missing or failed; the message names the program and what to install."""


def check_pronouncing_programs() -> None:
    """Raise one PronunciationError naming every missing program and its Debian package."""
    missing = [program for program in PRONOUNCING_PROGRAMS if shutil.which(program) is None]
    if missing:
        packages = " ".join(sorted({PRONOUNCING_PROGRAMS[p] for p in missing}))
        raise PronunciationError(
            f"pronouncing words needs {', '.join(missing)}, not found on PATH: install the Debian package(s) "
            f"with `sudo apt-get install -y {packages}` (or run `bash .ci/install.sh`)")


def _run(command: list[str], text: str | None = None) -> str:
    try:
        return subprocess.run(command, input=text, capture_output=True, text=True, check=True,
                              env={**os.environ, "LC_ALL": "C.UTF-8"}).stdout
    except FileNotFoundError:
        check_pronouncing_programs()
        raise
    except subprocess.CalledProcessError as error:
        raise PronunciationError(f"`{' '.join(command[:4])} ...` failed with exit status {error.returncode}: "
                                 f"{error.stderr.strip()[-300:]}") from None


def _espeak_words(words: list[str], voice: str) -> list[str]:
    """espeak-ng's phoneme text of each word said alone (one output line per input line)."""
    lines = _run(["espeak-ng", "-v", voice, "-q", "-x", "--sep= "], "\n".join(words) + "\n").splitlines()
    lines = [line for line in lines if line.strip()]
    if len(lines) == len(words):
        return lines
    return [_run(["espeak-ng", "-v", voice, "-q", "-x", "--sep= ", word]) for word in words]


def _flite_words(words: list[str]) -> list[str]:
    """flite's segments of each word said alone: words joined by full stops give pau-separated groups."""
    groups = [g.strip() for g in _run(["flite", "-ps", "-t", ". ".join(words) + ".", "-o", "none"]).split("pau")]
    groups = [g for g in groups if g]
    if len(groups) == len(words):
        return groups
    return [_run(["flite", "-ps", "-t", word + ".", "-o", "none"]) for word in words]


def synthesiser_pronunciations(words: list[str]) -> tuple[dict[str, list[tuple[str, ...]]], list[str]]:
    """(word -> distinct ARPABET_39 pronunciations, words no synthesiser pronounces in ARPAbet)."""
    check_pronouncing_programs()
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


def add_weak_forms(lexicon: dict[str, list[tuple[str, ...]]], texts: list[str],
                   count: int = WEAK_FORM_WORDS) -> None:
    """Adds the weak form of the `count` most frequent one-vowel words of `texts` (in place)."""
    frequencies = Counter(word for text in texts for word in text.split())
    frequent = [word for word, _ in frequencies.most_common()
                if word in lexicon and all(weak_form(s) for s in lexicon[word])][:count]
    for word in frequent:
        for spelling in list(lexicon[word]):
            reduced = weak_form(spelling)
            if reduced not in lexicon[word]:
                lexicon[word].append(reduced)


def espeak_sentence_phones(text: str, voice: str = "en-us") -> list[str]:
    """The ARPABET_39 phones espeak-ng says for a whole sentence (weak forms and all, in context);
    UnmappablePhonemeError when it uses a sound outside ARPAbet."""
    return espeak_to_arpabet(_run(["espeak-ng", "-v", voice, "-q", "-x", "--sep= ", text]))

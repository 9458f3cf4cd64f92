"""The Asterisk prompts' words: the transcript file read, what the speaker says in each prompt, which
prompts are left out and why, and each prompt's split (``recipes.asterisk.prepare`` makes the set).

- Text: the prompt's words as the synthetic corpus writes them (lowercase a-z and apostrophes,
  `asr.text.normalisation.normalise_transcript`), after these steps, in order:
  1. notes are removed: `[ascending tones]`, `(10 seconds of silence)`, `(note: does not say "2")`,
     `<beep ascending>`;
  2. misspellings of the transcript file are corrected (SPELLING_FIXES: "represenatives",
     "exclaimation", "umute", "indentified", "witheld", "fourtieth", and "thru" -> "through");
  3. each remaining token is read: a single digit 1-9 becomes its word ("press 1" -> "press one");
     "0" (zero or oh?), longer numbers ("1234", "500": digit by digit or as a number?), "28.8",
     "H.323" and any other token with a digit are uncertain, and so are symbols read aloud (`*`,
     `#`: star or asterisk, pound or hash?) and web addresses: such prompts are left out, except
     the few tokens in READINGS ("3D" -> "three D"). Dotted initials ("A.M.") and the all-capital
     abbreviations in LETTER_ABBREVIATIONS (PBX, IVR, IP, MGCP, USB) are read as letters ("u s b";
     single capitals "Q", "M I S D N" are letters already). Other all-capital words (IAX, SIP,
     DAHDI) are left out: the recordings say IAX and SIP as one syllable each ("eeks", "sip":
     0.55 and 0.50 s of speech, as long as "Zap", against 0.92 s for the three letters "N B S"),
     and no spelling tells espeak-ng that;
  4. prompts of fewer than two words are left out (single digits, letters, month names: too short
     to score and often ambiguous, "a" the letter or the article).
  Every prompt left out is counted by reason in the report (`left_out` of build_manifests).
- Split: by the prompt's normalised text, fixed: the first byte of its SHA-256 even -> dev, odd ->
  test. Prompts recorded twice with the same words (`invalid` and `pbx-invalid`) land in the same
  split, so no sentence is in both; a new package version moves no old prompt to the other split.
"""

from __future__ import annotations

import gzip
import hashlib
import re
from dataclasses import dataclass
from pathlib import Path

from asr.data.corpus.preparation_report import Problem
from asr.text.normalisation import normalise_transcript

MIN_WORDS = 2
# Bump when a rule below changes: a finished folder made under other rules is then prepared again.
TEXT_RULES_VERSION = 1

_NOTE = re.compile(r"\[[^\]]*\]|\([^)]*\)|<[^>]*>")
SPELLING_FIXES = {
    "represenatives": "representatives", "exclaimation": "exclamation", "umute": "unmute",
    "indentified": "identified", "witheld": "withheld", "fourtieth": "fortieth", "thru": "through",
}
_MISSPELLED = re.compile(r"\b(" + "|".join(SPELLING_FIXES) + r")\b", re.IGNORECASE)
DIGIT_WORDS = dict(zip("123456789", "one two three four five six seven eight nine".split()))
READINGS = {"3D": "three D"}
LETTER_ABBREVIATIONS = frozenset({"PBX", "IVR", "IP", "MGCP", "USB"})
_SENTENCE_PUNCTUATION = ".,!?;:\"'"
_DOTTED_INITIALS = re.compile(r"(?:[A-Z]\.)+[A-Z]?")       # "A.M" once the final dot is stripped
_CAPITALS = re.compile(r"[A-Z]{2,}")
_WORD = re.compile(r"[A-Za-z]+(?:['-][A-Za-z]+)*")
# why a prompt is left out -> the report's problem kind
NO_WORDS, ONE_WORD = "no_words", "one_word"
UNCERTAIN_NUMBER, UNCERTAIN_SYMBOL = "uncertain_number", "uncertain_symbol"
UNCERTAIN_ABBREVIATION = "uncertain_abbreviation"
UNMAPPABLE_PHONEME, NO_AUDIO, NO_TRANSCRIPT = "unmappable_phoneme", "no_audio", "no_transcript"


def read_transcripts(path: Path) -> tuple[dict[str, str], list[Problem]]:
    """{'digits/a-m': 'A.M.', ...} from `name: text` lines (gzipped or not); malformed and repeated
    names are problems (bad_transcript)."""
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt", encoding="utf-8") as handle:
        lines = handle.read().splitlines()
    transcripts: dict[str, str] = {}
    problems = []
    for number, line in enumerate(lines, 1):
        if not line.strip() or line.startswith(";"):
            continue
        name, colon, text = line.partition(":")
        name = name.strip()
        if not colon or not name or " " in name:
            problems.append(Problem("bad_transcript", f"{path.name}:{number}",
                                    f"{path}: line {number} is not `name: text`: {line[:60]!r}"))
        elif name in transcripts:
            problems.append(Problem("bad_transcript", name, f"{path}: line {number} repeats prompt {name!r}"))
        else:
            transcripts[name] = text.strip()
    return transcripts, problems


def read_aloud(transcript: str) -> tuple[str, str | None]:
    """(what the speaker reads, written for espeak-ng; the reason to leave the prompt out or None):
    notes removed, spellings fixed, digits and abbreviations spelled out (module doc, steps 1-3)."""
    spoken = _MISSPELLED.sub(lambda match: SPELLING_FIXES[match.group(0).lower()], _NOTE.sub(" ", transcript))
    tokens = []
    for token in spoken.split():
        core = token.strip(_SENTENCE_PUNCTUATION)
        if not core:
            tokens.append(token)                       # "..." : a pause, no word
            continue
        if core in READINGS:
            reading = READINGS[core]
        elif core in DIGIT_WORDS:
            reading = DIGIT_WORDS[core]
        elif any(character.isdigit() for character in core):
            return "", UNCERTAIN_NUMBER
        elif _DOTTED_INITIALS.fullmatch(core):
            reading = core                             # espeak-ng says "A.M." as letters; text "a m"
        elif _CAPITALS.fullmatch(core):
            if core not in LETTER_ABBREVIATIONS:
                return "", UNCERTAIN_ABBREVIATION
            reading = " ".join(core)                   # "U S B": letters for espeak-ng and for the text
        elif _WORD.fullmatch(core):
            reading = core
        else:
            return "", UNCERTAIN_SYMBOL                # "*", "#", "www.asterisk.org"
        start = token.index(core)
        tokens.append(token[:start] + reading + token[start + len(core):])
    return " ".join(tokens), None


@dataclass(frozen=True)
class Prompt:
    name: str                   # as in the transcript file: "digits/a-m"
    transcript: str             # its text there
    spoken: str                 # what espeak-ng reads for the phones ("" when left out)
    text: str                   # normalised words
    left_out: str | None = None  # the reason, or None

    @property
    def id(self) -> str:
        return self.name.replace("/", "-")


def read_prompt(name: str, transcript: str) -> Prompt:
    """One transcript line -> its spoken form and words, or the reason it is left out."""
    if not _NOTE.sub(" ", transcript).strip(_SENTENCE_PUNCTUATION + " "):
        return Prompt(name, transcript, "", "", NO_WORDS)          # only a note: tones, silence
    spoken, reason = read_aloud(transcript)
    if reason is not None:
        return Prompt(name, transcript, "", "", reason)
    text = normalise_transcript(spoken.split())
    if len(text.split()) < MIN_WORDS:
        return Prompt(name, transcript, spoken, text, ONE_WORD if text else NO_WORDS)
    return Prompt(name, transcript, spoken, text)


def split_of(text: str) -> str:
    """'dev' or 'test', fixed by the words: the first byte of their SHA-256, even or odd."""
    return "dev" if hashlib.sha256(text.encode("utf-8")).digest()[0] % 2 == 0 else "test"


def read_prompts(sounds_dir: Path, transcripts_path: Path) -> tuple[list[Prompt], list[Problem], list[Problem]]:
    """(every transcript line as a Prompt, problems of the transcript file, prompts left out as
    Problems: by the text rules, and for a transcript without audio or audio without transcript)."""
    transcripts, problems = read_transcripts(transcripts_path)
    audio = {path.relative_to(sounds_dir).with_suffix("").as_posix() for path in sounds_dir.rglob("*.g722")}
    prompts = [read_prompt(name, transcript) for name, transcript in transcripts.items()]
    left_out = [Problem(prompt.left_out, prompt.name, f"{prompt.name}: {prompt.transcript!r}: {prompt.left_out}")
                for prompt in prompts if prompt.left_out is not None]
    for prompt in prompts:
        if prompt.left_out is None and prompt.name not in audio:
            left_out.append(Problem(NO_AUDIO, prompt.name, f"{prompt.name}: in {transcripts_path.name}, but "
                                                           f"{sounds_dir}/{prompt.name}.g722 does not exist"))
    for name in sorted(audio - set(transcripts)):
        left_out.append(Problem(NO_TRANSCRIPT, name, f"{sounds_dir}/{name}.g722: no line in {transcripts_path.name}"))
    return prompts, problems, left_out

"""Debian's Asterisk voice prompts -> a real-speech dev/test set (one human voice, studio quality).

    python -m recipes.asterisk.prepare --out data/asterisk

Layout read (the Debian packages asterisk-core-sounds-en-g722 and asterisk-core-sounds-en):

    /usr/share/asterisk/sounds/en_US_f_Allison/vm-intro.g722             raw G.722, 64 kbit/s, 16 kHz
    /usr/share/asterisk/sounds/en_US_f_Allison/digits/5.g722             (subfolders digits/, letters/, ...)
    /usr/share/doc/asterisk-core-sounds-en/core-sounds-en.txt.gz         `name: text` lines, `;` comments

- Audio: each prompt is decoded once by `ffmpeg -f g722` into 16 kHz mono 16-bit FLAC under
  `{out}/audio/` (written atomically by asr.data.manifest_builder; a rerun decodes only what is
  missing). G.722 codes two samples per byte, so a file of B bytes must decode to 2B samples at
  16 kHz; any other rate or length is an unreadable_audio problem (`--bad-data`).
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
- Phones (the PER reference), ARPABET_39: espeak-ng en-us's phonemes for the whole prompt as
  read in step 3 (`asr.evaluation.decoding.pronunciation.espeak_sentence_phones`, the text with its
  punctuation), mapped by asr.text.synthesiser_phonemes. That is how three quarters of the synthetic
  training targets were made (espeak-ng en-us / en-us-nyc reading whole sentences, with their weak
  forms and flaps in context), so a model is scored against the conventions it was trained on,
  and the reference is one fixed transcription, not a choice among a lexicon's variants. A prompt
  for which espeak-ng uses a sound outside ARPAbet is left out (unmappable_phoneme).
- Split: by the prompt's normalised text, fixed: the first byte of its SHA-256 even -> dev, odd ->
  test. Prompts recorded twice with the same words (`invalid` and `pbx-invalid`) land in the same
  split, so no sentence is in both; a new package version moves no old prompt to the other split.
- Lexicon: `{out}/lexicon.txt`, every word of the set as espeak-ng (en-us, en-us-nyc) and flite say
  it alone (`asr.evaluation.decoding.pronunciation.synthesiser_pronunciations`), plus the weak form (vowel ->
  AH, vowel + R -> ER) of the words the synthetic corpus's lexicon reduces: its 100 most frequent
  one-vowel words, ranked over the shipped sentence list (the corpus's training text is drawn from
  it; the last few of the 100 can differ). So the set's lexicon extends that corpus's lexicon for
  lexicon + LM decoding with the same rules; ranked by these prompts instead, "press" and "please"
  would get weak forms. There is no LM: the set has no training text.

Utterance and recording ids are the prompt names with `/` -> `-` (`digits-a-m`); one speaker,
`allison`. No train split: this is an evaluation set
(`python -m asr.evaluate checkpoint=... data.corpus=asterisk split=test`).
"""

from __future__ import annotations

import argparse
import gzip
import hashlib
import io
import json
import os
import re
import shutil
import subprocess
import sys
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import soundfile
from tqdm.auto import tqdm

from asr.data.audio_source import AudioMissingError, AudioSource, AudioSourceError, select_channel
from asr.data.manifest_builder import (
    Problem,
    RecordingSpec,
    UtteranceSpec,
    build_manifests,
    file_identity,
    previous_complete_report,
    report_path,
)
from asr.text.synthesiser_phonemes import UnmappablePhonemeError
from asr.text.normalisation import normalise_transcript
from asr.evaluation.decoding.lexicon import write_lexicon
from asr.evaluation.decoding.pronunciation import (
    WEAK_FORM_WORDS,
    PronunciationError,
    add_weak_forms,
    espeak_sentence_phones,
    synthesiser_pronunciations,
    weak_form,
)
from recipes.preparation_command import add_preparation_arguments, run_preparation
from recipes.synth.sentences import load_sentences, normalise_text

CORPUS = "asterisk"
SOUNDS_DIR = Path("/usr/share/asterisk/sounds/en_US_f_Allison")
TRANSCRIPTS = Path("/usr/share/doc/asterisk-core-sounds-en/core-sounds-en.txt.gz")
PACKAGES = ("asterisk-core-sounds-en-g722", "asterisk-core-sounds-en")
# program -> the Debian package that provides it: ffmpeg decodes G.722, espeak-ng makes the phone
# references, espeak-ng and flite pronounce the lexicon's words
PROGRAMS = {"ffmpeg": "ffmpeg", "espeak-ng": "espeak-ng", "flite": "flite"}
SPEAKER = "allison"
ESPEAK_VOICE = "en-us"
SAMPLE_RATE = 16000
G722_SAMPLES_PER_BYTE = 2           # 64 kbit/s at 16 kHz: 4 bits per sample
MIN_WORDS = 2
LEXICON_FILE = "lexicon.txt"
# The synthetic corpus's 100 (WEAK_FORM_WORDS) most frequent one-vowel words are among the
# FREQUENT_WORDS most frequent words of its sentences (229 of which are one-vowel words).
FREQUENT_WORDS = 300
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


class AsteriskSetupError(RuntimeError):
    """The packages or programs the recipe reads with are not installed; the message says what to install
    (a failure of the machine, exit status 1, as the synthetic corpus's missing synthesisers)."""


# ---------------------------------------------------------------------------- the prompts' words

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


# ---------------------------------------------------------------------------- audio

@dataclass(frozen=True)
class G722File(AudioSource):
    """A raw G.722 file, decoded by ffmpeg; a decoded rate other than 16 kHz or a length other than
    two samples per byte is an error (a damaged or truncated file, or a decoder that changed)."""

    def load(self) -> tuple[np.ndarray, int]:
        path = Path(self.path)
        if not path.is_file():
            raise AudioMissingError(f"{path}: file not found")
        command = ["ffmpeg", "-nostdin", "-v", "error", "-f", "g722", "-i", str(path), "-f", "wav", "-"]
        result = subprocess.run(command, capture_output=True)
        message = result.stderr.decode(errors="replace").strip().splitlines()
        if result.returncode != 0:
            raise AudioSourceError(f"{path}: `ffmpeg -f g722` failed (exit {result.returncode}): "
                                   f"{message[-1] if message else ''}")
        try:
            samples, rate = soundfile.read(io.BytesIO(result.stdout), dtype="int16", always_2d=True)
        except (RuntimeError, soundfile.LibsndfileError) as error:
            raise AudioSourceError(f"{path}: `ffmpeg -f g722` wrote no readable audio ({error})") from None
        expected = G722_SAMPLES_PER_BYTE * path.stat().st_size
        if rate != SAMPLE_RATE or len(samples) != expected:
            raise AudioSourceError(f"{path}: decoded to {len(samples)} samples at {rate} Hz; G.722 of "
                                   f"{path.stat().st_size} bytes is {expected} samples at {SAMPLE_RATE} Hz")
        return select_channel(samples.T.copy(), None, str(path)), rate


# ---------------------------------------------------------------------------- phones and the whole set

def check_installed(sounds_dir: Path, transcripts: Path) -> None:
    """AsteriskSetupError naming the Debian packages, or the programs, that are missing."""
    missing = [str(path) for path, found in ((sounds_dir, sounds_dir.is_dir()), (transcripts, transcripts.is_file()))
               if not found]
    if missing:
        raise AsteriskSetupError(
            f"{' and '.join(missing)} not found: install the Debian packages {' and '.join(PACKAGES)} "
            f"(`sudo apt-get install -y --no-install-recommends {' '.join(PACKAGES)}`, or `bash .ci/install.sh`), "
            "or give --sounds-dir and --transcripts")
    programs = [program for program in PROGRAMS if shutil.which(program) is None]
    if programs:
        packages = " ".join(sorted({PROGRAMS[p] for p in programs}))
        raise AsteriskSetupError(f"preparing the asterisk set needs {', '.join(programs)}, not found on PATH: "
                                 f"install the Debian package(s) with `sudo apt-get install -y {packages}` "
                                 "(or run `bash .ci/install.sh`)")


def sentence_phones(prompts: list[Prompt], jobs: int, progress: bool) -> dict[str, str | UnmappablePhonemeError]:
    """name -> the ARPABET_39 phones espeak-ng en-us says for the prompt, or why it cannot."""
    def phones(prompt: Prompt):
        try:
            return " ".join(espeak_sentence_phones(prompt.spoken, ESPEAK_VOICE))
        except UnmappablePhonemeError as error:
            return error

    with ThreadPoolExecutor(max_workers=jobs) as pool:     # each call waits on an espeak-ng process
        results = tqdm(pool.map(phones, prompts), total=len(prompts), desc=f"{CORPUS}: phones", unit="prompt",
                       disable=not progress)
        # strict: zip then asks the bar for one more item, so it reaches its end and closes (306/306, not 305)
        return {prompt.name: result for prompt, result in zip(prompts, results, strict=True)}


def synthetic_corpus_weak_form_words() -> set[str]:
    """The words the synthetic corpus's lexicon lists weak forms of (recipes.synth.lexicon_lm): its
    most frequent one-vowel words, counted here over the shipped sentence list its text comes from."""
    texts = [normalise_text(sentence) for sentence in load_sentences()]
    frequencies = Counter(word for text in texts for word in text.split())
    frequent, _ = synthesiser_pronunciations([word for word, _ in frequencies.most_common(FREQUENT_WORDS)])
    one_vowel = [word for word in frequent if all(weak_form(spelling) for spelling in frequent[word])]
    return set(sorted(one_vowel, key=frequencies.__getitem__, reverse=True)[:WEAK_FORM_WORDS])


def write_set_lexicon(out_dir: Path, texts: list[str]) -> dict:
    """{out}/lexicon.txt: every word of `texts` as the synthesisers say it alone, plus the weak forms
    the synthetic corpus's lexicon has for the same words."""
    words = sorted({word for text in texts for word in text.split()})
    lexicon, unpronounced = synthesiser_pronunciations(words)
    weak_words = sorted(synthetic_corpus_weak_form_words() & lexicon.keys())
    add_weak_forms(lexicon, [" ".join(weak_words)], count=len(weak_words))   # each word once: all of them
    path = write_lexicon(lexicon, out_dir / LEXICON_FILE)
    return {"path": str(path), "words": len(lexicon), "pronunciations": sum(map(len, lexicon.values())),
            "weak_form_words": weak_words, "unpronounced_words": unpronounced}


def prepare_asterisk(out_dir, sounds_dir=None, transcripts=None, *, bad_data_policy: str = "error",
                     jobs: int | None = None, progress: bool = True) -> dict:
    """Prepare the dev/test manifests and the lexicon of the Asterisk prompts under out_dir; returns
    the report (see asr.data.manifest_builder; plus `lexicon` and minutes per split).
    sounds_dir / transcripts: the Debian packages' folder and file (SOUNDS_DIR, TRANSCRIPTS)."""
    out_dir = Path(out_dir).resolve()
    sounds_dir = Path(sounds_dir or SOUNDS_DIR).resolve()
    transcripts = Path(transcripts or TRANSCRIPTS).resolve()
    check_installed(sounds_dir, transcripts)
    settings = {"recipe": CORPUS, "sounds_dir": str(sounds_dir), "transcripts": file_identity(transcripts),
                "text_rules": TEXT_RULES_VERSION, "espeak_voice": ESPEAK_VOICE, "bad_data_policy": bad_data_policy}
    done = previous_complete_report(out_dir, CORPUS, settings)
    if done is not None and "lexicon" in done and (out_dir / LEXICON_FILE).is_file():
        return done
    jobs = max(1, jobs or min(4, os.cpu_count() or 1))

    prompts, problems, left_out = read_prompts(sounds_dir, transcripts)
    unusable = {problem.item for problem in left_out}
    candidates = [prompt for prompt in prompts if prompt.name not in unusable]
    phones = sentence_phones(candidates, jobs, progress)
    recordings, utterances = [], []
    for prompt in candidates:
        if isinstance(phones[prompt.name], UnmappablePhonemeError):
            left_out.append(Problem(UNMAPPABLE_PHONEME, prompt.name, f"{prompt.name}: {phones[prompt.name]}"))
            continue
        recordings.append(RecordingSpec(prompt.id, G722File(path=str(sounds_dir / f"{prompt.name}.g722"))))
        utterances.append(UtteranceSpec(id=prompt.id, split=split_of(prompt.text), recording_id=prompt.id,
                                        speaker=SPEAKER, text=prompt.text, phones=phones[prompt.name]))
    report = build_manifests(CORPUS, out_dir, recordings, utterances, problems, settings=settings,
                             left_out=left_out, bad_data_policy=bad_data_policy, phone_set="arpabet39",
                             jobs=jobs, progress=progress)
    for row in report["splits"].values():
        row["minutes"] = round(row["hours"] * 60, 1)
    report["lexicon"] = write_set_lexicon(out_dir, [utterance.text for utterance in utterances])
    path = report_path(out_dir, CORPUS)       # again, with the lexicon: written last, so a report with it is whole
    partial = path.with_name(path.name + ".partial")
    partial.write_text(json.dumps(report, indent=2) + "\n")
    os.replace(partial, path)
    return report


def print_extra_summary(report: dict) -> None:
    """After the report table (asr.data.manifest_builder.format_report): minutes and the lexicon."""
    lines = []
    lines.append("minutes: " + ", ".join(f"{split} {row['minutes']}" for split, row in report["splits"].items()))
    lexicon = report["lexicon"]
    lines.append(f"lexicon: {lexicon['words']} words, {lexicon['pronunciations']} pronunciations -> {lexicon['path']}"
                 + (f" (no pronunciation: {' '.join(lexicon['unpronounced_words'])})"
                    if lexicon["unpronounced_words"] else ""))
    print("\n".join(lines))


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", default="data/asterisk", help="where the manifests, audio and lexicon go "
                                                               "(default data/asterisk)")
    parser.add_argument("--sounds-dir", default=str(SOUNDS_DIR),
                        help=f"the G.722 prompts of {PACKAGES[0]} (default {SOUNDS_DIR})")
    parser.add_argument("--transcripts", default=str(TRANSCRIPTS),
                        help=f"the transcript file of {PACKAGES[1]} (default {TRANSCRIPTS})")
    add_preparation_arguments(parser)
    args = parser.parse_args(argv)

    def prepare() -> dict:
        return prepare_asterisk(args.out, args.sounds_dir, args.transcripts, bad_data_policy=args.bad_data,
                                jobs=args.jobs, progress=not args.no_progress)

    return run_preparation("recipes.asterisk.prepare", prepare, after=print_extra_summary,
                           failures=(AsteriskSetupError, PronunciationError))


if __name__ == "__main__":
    sys.exit(main())

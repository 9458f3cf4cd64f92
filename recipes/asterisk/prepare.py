"""Debian's Asterisk voice prompts -> a real-speech dev/test set (one human voice, studio quality).

    python -m recipes.asterisk.prepare --out data/asterisk

Layout read (the Debian packages asterisk-core-sounds-en-g722 and asterisk-core-sounds-en):

    /usr/share/asterisk/sounds/en_US_f_Allison/vm-intro.g722             raw G.722, 64 kbit/s, 16 kHz
    /usr/share/asterisk/sounds/en_US_f_Allison/digits/5.g722             (subfolders digits/, letters/, ...)
    /usr/share/doc/asterisk-core-sounds-en/core-sounds-en.txt.gz         `name: text` lines, `;` comments

- Audio: each prompt is decoded once by `ffmpeg -f g722` into 16 kHz mono 16-bit FLAC under
  `{out}/audio/` (written atomically by asr.data.corpus.manifest_builder; a rerun decodes only what is
  missing). G.722 codes two samples per byte, so a file of B bytes must decode to 2B samples at
  16 kHz; any other rate or length is an unreadable_audio problem (`--bad-data`).
- Text and split: the prompt's words as the speaker reads them (steps 1-4; which prompts are left
  out and why) and its dev/test split, by the rules in ``recipes.asterisk.prompts``.
- Phones (the PER reference), ARPABET_39: espeak-ng en-us's phonemes for the whole prompt as
  read in step 3 of the text rules (`asr.evaluation.decoding.pronunciation.espeak_sentence_phones`, the text
  with its punctuation), mapped by asr.text.synthesiser_phonemes. That is how three quarters of the synthetic
  training targets were made (espeak-ng en-us / en-us-nyc reading whole sentences, with their weak
  forms and flaps in context), so a model is scored against the conventions it was trained on,
  and the reference is one fixed transcription, not a choice among a lexicon's variants. A prompt
  for which espeak-ng uses a sound outside ARPAbet is left out (unmappable_phoneme).
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
import io
import json
import os
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

from asr.data.audio.audio_source import AudioMissingError, AudioSource, AudioSourceError, select_channel
from asr.data.corpus.manifest_builder import RecordingSpec, UtteranceSpec, build_manifests, file_identity
from asr.data.corpus.preparation_report import Problem, previous_complete_report, report_path
from asr.text.synthesiser_phonemes import UnmappablePhonemeError
from asr.evaluation.decoding.lexicon import write_lexicon
from asr.evaluation.decoding.pronunciation import (
    WEAK_FORM_WORDS,
    PronunciationError,
    add_weak_forms,
    espeak_sentence_phones,
    synthesiser_pronunciations,
    weak_form,
)
from recipes.asterisk.prompts import TEXT_RULES_VERSION, UNMAPPABLE_PHONEME, Prompt, read_prompts, split_of
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
LEXICON_FILE = "lexicon.txt"
# The synthetic corpus's 100 (WEAK_FORM_WORDS) most frequent one-vowel words are among the
# FREQUENT_WORDS most frequent words of its sentences (229 of which are one-vowel words).
FREQUENT_WORDS = 300


class AsteriskSetupError(RuntimeError):
    """The packages or programs the recipe reads with are not installed; the message says what to install
    (a failure of the machine, exit status 1, as the synthetic corpus's missing synthesisers)."""


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
    the report (see asr.data.corpus.manifest_builder; plus `lexicon` and minutes per split).
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
    """After the report table (asr.data.corpus.preparation_report.format_report): minutes and the lexicon."""
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

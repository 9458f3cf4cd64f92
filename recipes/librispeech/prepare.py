"""LibriSpeech (OpenSLR 12) -> manifests with word targets (sentencepiece pieces are trained from
the training text by asr.data), and phone targets when a lexicon is given.

Layout read (as the OpenSLR tarballs unpack; `--corpus-dir` is the folder holding them, or the
`LibriSpeech/` folder inside it):

    LibriSpeech/<subset>/<speaker>/<chapter>/<speaker>-<chapter>.trans.txt
    LibriSpeech/<subset>/<speaker>/<chapter>/<speaker>-<chapter>-<utterance>.flac

Splits: train = the `--train-subsets` (default all three: train-clean-100, train-clean-360,
train-other-500, i.e. LibriSpeech 960 h), dev = dev-clean, test = test-clean, and, when present,
dev_other = dev-other and test_other = test-other (select them with data.dev_split / data.test_split).

Audio is already 16 kHz mono FLAC: the manifests reference the original files (absolute paths),
nothing is copied. Transcripts (uppercase words with apostrophes) are lowercased.

Phones (optional): `--lexicon` with a CMUdict-format file, e.g. OpenSLR 11's
librispeech-lexicon.txt (it covers every word of the corpus; CMUdict alone does not).

    python -m recipes.librispeech.prepare --corpus-dir /data/LibriSpeech --out data/librispeech
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from asr.data.audio_source import AudioSource
from asr.data.manifest_builder import (
    Problem,
    RecordingSpec,
    UtteranceSpec,
    build_manifests,
    file_identity,
    previous_complete_report,
)
from asr.data.text_normalisation import normalise_transcript
from recipes.lexicon import Lexicon
from recipes.preparation_command import add_preparation_arguments, run_preparation

TRAIN_SUBSETS = ("train-clean-100", "train-clean-360", "train-other-500")
EVALUATION_SUBSETS = {"dev-clean": "dev", "test-clean": "test", "dev-other": "dev_other", "test-other": "test_other"}
REQUIRED_EVALUATION_SUBSETS = ("dev-clean", "test-clean")


class LibriSpeechLayoutError(ValueError):
    """A subset folder that is not there."""


def find_subsets_root(corpus_dir: Path) -> Path:
    """The folder holding the subset folders: corpus_dir itself or its LibriSpeech/ child."""
    for candidate in (corpus_dir, corpus_dir / "LibriSpeech"):
        if candidate.is_dir() and any((candidate / s).is_dir() for s in (*TRAIN_SUBSETS, *EVALUATION_SUBSETS)):
            return candidate
    raise LibriSpeechLayoutError(
        f"{corpus_dir}: no LibriSpeech subset folders (train-clean-100, dev-clean, ...) in it or in its "
        "LibriSpeech/ folder; unpack the OpenSLR 12 tarballs (https://www.openslr.org/12) there"
    )


def read_subset(subset_dir: Path, split: str):
    recordings, utterances, problems = [], [], []
    for transcript in sorted(subset_dir.glob("*/*/*.trans.txt")):
        chapter_dir = transcript.parent
        flacs = {p.stem: p for p in chapter_dir.glob("*.flac")}
        transcribed = set()
        for number, line in enumerate(transcript.read_text(encoding="utf-8").splitlines(), start=1):
            fields = line.split()
            if not fields:
                continue
            utterance_id = fields[0]
            transcribed.add(utterance_id)
            audio = chapter_dir / f"{utterance_id}.flac"
            if utterance_id not in flacs:
                problems.append(Problem("missing_audio", utterance_id, f"{audio}: file not found ({transcript}:{number})"))
                continue
            recordings.append(RecordingSpec(utterance_id, AudioSource(path=str(audio)), reference_if_compatible=True))
            utterances.append((split, utterance_id, utterance_id.split("-")[0], fields[1:]))
        for stem in sorted(set(flacs) - transcribed):
            problems.append(Problem("missing_transcript", stem, f"{flacs[stem]}: no line in {transcript}"))
    return recordings, utterances, problems


def prepare_librispeech(corpus_dir, out_dir, *, train_subsets=TRAIN_SUBSETS, lexicon=None, extra_lexicon=(),
                        oov_policy: str = "error", bad_data_policy: str = "error", jobs: int | None = None,
                        progress: bool = True) -> dict:
    """Prepare LibriSpeech manifests under out_dir; returns the report (see manifest_builder)."""
    corpus_dir = Path(corpus_dir).resolve()
    train_subsets = tuple(train_subsets)
    unknown = [s for s in train_subsets if s not in TRAIN_SUBSETS]
    if unknown:
        raise LibriSpeechLayoutError(f"unknown training subset(s) {unknown}; choose from {TRAIN_SUBSETS}")
    lexicon_files = ([Path(lexicon)] if lexicon else []) + [Path(p) for p in extra_lexicon]
    settings = {"recipe": "librispeech", "corpus_dir": str(corpus_dir), "train_subsets": list(train_subsets),
                "lexicons": [file_identity(p) for p in lexicon_files],
                "oov_policy": oov_policy, "bad_data_policy": bad_data_policy}
    done = previous_complete_report(Path(out_dir), "librispeech", settings)
    if done is not None:
        return done
    pronunciations = Lexicon.load(lexicon_files) if lexicon_files else None
    root = find_subsets_root(corpus_dir)
    wanted = [(s, "train") for s in train_subsets] + list(EVALUATION_SUBSETS.items())
    missing = [s for s, _ in wanted if not (root / s).is_dir()
               and (s in train_subsets or s in REQUIRED_EVALUATION_SUBSETS)]
    if missing:
        present = sorted(p.name for p in root.iterdir() if p.is_dir())
        raise LibriSpeechLayoutError(
            f"{root}: subset folder(s) {missing} not found (present: {present}); download them from "
            "https://www.openslr.org/12, or choose the training subsets you have with --train-subsets"
        )
    recordings, utterances, problems = [], [], []
    for subset, split in wanted:
        if not (root / subset).is_dir():
            continue  # dev-other / test-other are optional
        subset_recordings, rows, subset_problems = read_subset(root / subset, split)
        recordings += subset_recordings
        problems += subset_problems
        for split_name, utterance_id, speaker, tokens in rows:
            phones, oov = pronunciations.pronounce(tokens) if pronunciations else (None, [])
            utterances.append(UtteranceSpec(
                id=utterance_id, split=split_name, recording_id=utterance_id, speaker=speaker,
                text=normalise_transcript(tokens), phones=" ".join(phones) if phones is not None else None,
                oov_words=tuple(oov),
            ))
    return build_manifests("librispeech", out_dir, recordings, utterances, problems, settings=settings,
                           oov_policy=oov_policy, bad_data_policy=bad_data_policy,
                           phone_set="arpabet39" if pronunciations else None, jobs=jobs, progress=progress)


from asr.decoding.lexicon import LexiconFileError  # noqa: E402  (decoding files' errors)
from asr.decoding.ngram import LanguageModelError  # noqa: E402


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--corpus-dir", required=True, help="the LibriSpeech folder (holding train-clean-100/ ...)")
    parser.add_argument("--out", default="data/librispeech", help="where the manifests go (default data/librispeech)")
    parser.add_argument("--train-subsets", nargs="+", default=list(TRAIN_SUBSETS), choices=TRAIN_SUBSETS)
    parser.add_argument("--lm-dir", default=None,
                        help="OpenSLR 11's folder (librispeech-lexicon.txt and the ARPA files): installs the "
                             "lexicon and --lm-name into --out for asr.evaluate decoder=lexicon")
    parser.add_argument("--lm-name", default="3-gram.pruned.1e-7.arpa.gz",
                        help="the ARPA file of --lm-dir to decode with (default 3-gram.pruned.1e-7.arpa.gz)")
    add_preparation_arguments(parser, lexicon="optional",
                              lexicon_help="CMUdict-format lexicon for phone targets (e.g. librispeech-lexicon.txt)")
    args = parser.parse_args(argv)

    def prepare():
        report = prepare_librispeech(args.corpus_dir, args.out, train_subsets=args.train_subsets,
                                     lexicon=args.lexicon, extra_lexicon=args.extra_lexicon, oov_policy=args.oov,
                                     bad_data_policy=args.bad_data, jobs=args.jobs, progress=not args.no_progress)
        if args.lm_dir:
            from recipes.decoding_files import install_decoding_files
            lm_dir = Path(args.lm_dir)
            install_decoding_files(args.out, lm_dir / "librispeech-lexicon.txt", lm_dir / args.lm_name)
        return report
    return run_preparation("recipes.librispeech.prepare", prepare,
                           (LibriSpeechLayoutError, LanguageModelError, LexiconFileError))


if __name__ == "__main__":
    sys.exit(main())

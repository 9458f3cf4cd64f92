"""LibriSpeech (OpenSLR 12) or mini LibriSpeech (OpenSLR 31) -> manifests with word targets
(sentencepiece pieces are trained from the training text by asr.data), and phone targets when a
lexicon is given. With `--download` it fetches the corpus first (download.py).

Layout read (as the OpenSLR tarballs unpack; `--corpus-dir` is the folder holding them, or the
`LibriSpeech/` folder inside it):

    LibriSpeech/<subset>/<speaker>/<chapter>/<speaker>-<chapter>.trans.txt
    LibriSpeech/<subset>/<speaker>/<chapter>/<speaker>-<chapter>-<utterance>.flac
    LibriSpeech/SPEAKERS.TXT   (read for mini LibriSpeech only: each reader's sex)

Splits: train = the `--train-subsets` (default all three: train-clean-100, train-clean-360,
train-other-500, i.e. LibriSpeech 960 h), dev = dev-clean, test = test-clean, and, when present,
dev_other = dev-other and test_other = test-other (select them with data.dev_split / data.test_split).

Mini LibriSpeech (`--train-subsets train-clean-5`, what `--download mini` prepares): train =
train-clean-5, and its only evaluation part, dev-clean-2, is cut in two by reader: dev and test
take every second reader in order of (sex, reader id), so neither shares a reader with the other
(nor with train: LibriSpeech's parts have disjoint readers) and both have as many women and men as
the part allows (+-1). The test split is thus about 1 h of clean speech, not test-clean: its
error rates are not comparable with published test-clean numbers.

Audio is already 16 kHz mono FLAC: the manifests reference the original files (absolute paths),
nothing is copied. Transcripts (uppercase words with apostrophes) are lowercased.

Phones (optional): `--lexicon` with a CMUdict-format file, e.g. OpenSLR 11's
librispeech-lexicon.txt (it covers every word of the corpus; CMUdict alone does not).

    python -m recipes.librispeech.prepare --corpus-dir /data/LibriSpeech --out data/librispeech
    python -m recipes.librispeech.prepare --download mini            # -> data/librispeech_mini
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from asr.data.audio.audio_source import AudioSource
from asr.data.corpus.manifest_builder import RecordingSpec, UtteranceSpec, build_manifests, file_identity
from asr.data.corpus.preparation_report import Problem, previous_complete_report
from asr.text.normalisation import normalise_transcript
from recipes.archive_download import (BadArchiveError, DownloadError, DownloadRequestError, http_url,
                                      read_md5_file)
from recipes.lexicon import Lexicon
from recipes.librispeech.download import (
    DOWNLOAD_NAMES, FULL_TRAIN_PARTS, OPENSLR, completed_parts, download_librispeech_parts, resolve_parts,
)
from recipes.preparation_command import add_preparation_arguments, run_preparation

TRAIN_SUBSETS = ("train-clean-100", "train-clean-360", "train-other-500")
EVALUATION_SUBSETS = {"dev-clean": "dev", "test-clean": "test", "dev-other": "dev_other", "test-other": "test_other"}
REQUIRED_EVALUATION_SUBSETS = ("dev-clean", "test-clean")
MINI_TRAIN_SUBSET, MINI_EVALUATION_SUBSET = "train-clean-5", "dev-clean-2"   # OpenSLR 31
ALL_SUBSETS = (*TRAIN_SUBSETS, *EVALUATION_SUBSETS, MINI_TRAIN_SUBSET, MINI_EVALUATION_SUBSET)


class LibriSpeechLayoutError(ValueError):
    """A subset folder that is not there."""


def find_subsets_root(corpus_dir: Path) -> Path:
    """The folder holding the subset folders: corpus_dir itself or its LibriSpeech/ child."""
    for candidate in (corpus_dir, corpus_dir / "LibriSpeech"):
        if candidate.is_dir() and any((candidate / s).is_dir() for s in ALL_SUBSETS):
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


def read_speaker_sexes(root: Path) -> dict[str, str]:
    """{reader id: 'F' or 'M'} from SPEAKERS.TXT ('ID | SEX | SUBSET | MINUTES | NAME' lines, ';'
    comments); empty when the file is not there."""
    path = root / "SPEAKERS.TXT"
    if not path.is_file():
        return {}
    sexes = {}
    for line in path.read_text(encoding="utf-8", errors="replace").splitlines():
        fields = [field.strip() for field in line.split("|")]
        if not line.startswith(";") and len(fields) >= 2:
            sexes[fields[0]] = fields[1]
    return sexes


def mini_test_speakers(speakers, sexes: dict[str, str]) -> set[str]:
    """The readers of dev-clean-2 whose utterances make mini LibriSpeech's test split: every second
    one in order of (sex, reader id); the others make dev."""
    ordered = sorted(set(speakers), key=lambda speaker: (sexes.get(speaker, "?"), len(speaker), speaker))
    return set(ordered[1::2])


def planned_subsets(root: Path, train_subsets: tuple[str, ...]) -> list[tuple[str, str]]:
    """(subset, split) pairs to read; a required subset that is missing is an error."""
    if MINI_TRAIN_SUBSET in train_subsets:
        wanted = [(MINI_TRAIN_SUBSET, "train"), (MINI_EVALUATION_SUBSET, "dev")]   # dev: later halved
        required = [subset for subset, _ in wanted]
    else:
        wanted = [(s, "train") for s in train_subsets] + list(EVALUATION_SUBSETS.items())
        required = [*train_subsets, *REQUIRED_EVALUATION_SUBSETS]
    missing = [s for s, _ in wanted if s in required and not (root / s).is_dir()]
    if missing:
        present = sorted(p.name for p in root.iterdir() if p.is_dir())
        raise LibriSpeechLayoutError(
            f"{root}: subset folder(s) {missing} not found (present: {present}); download them from "
            "https://www.openslr.org/12 (or 31 for mini LibriSpeech, or use --download), or choose the training "
            "subsets you have with --train-subsets"
        )
    return [(s, split) for s, split in wanted if (root / s).is_dir()]   # dev-other / test-other are optional


def prepare_librispeech(corpus_dir, out_dir, *, train_subsets=TRAIN_SUBSETS, lexicon=None, extra_lexicon=(),
                        oov_policy: str = "error", bad_data_policy: str = "error", jobs: int | None = None,
                        progress: bool = True) -> dict:
    """Prepare LibriSpeech manifests under out_dir; returns the report (see manifest_builder)."""
    corpus_dir = Path(corpus_dir).resolve()
    train_subsets = tuple(train_subsets)
    unknown = [s for s in train_subsets if s not in (*TRAIN_SUBSETS, MINI_TRAIN_SUBSET)]
    if unknown:
        raise LibriSpeechLayoutError(f"unknown training subset(s) {unknown}; choose from "
                                     f"{(*TRAIN_SUBSETS, MINI_TRAIN_SUBSET)}")
    if MINI_TRAIN_SUBSET in train_subsets and len(train_subsets) > 1:
        raise LibriSpeechLayoutError(f"--train-subsets {' '.join(train_subsets)}: {MINI_TRAIN_SUBSET} (mini "
                                     "LibriSpeech, with its own dev and test) trains alone")
    lexicon_files = ([Path(lexicon)] if lexicon else []) + [Path(p) for p in extra_lexicon]
    settings = {"recipe": "librispeech", "corpus_dir": str(corpus_dir), "train_subsets": list(train_subsets),
                "lexicons": [file_identity(p) for p in lexicon_files],
                "oov_policy": oov_policy, "bad_data_policy": bad_data_policy}
    done = previous_complete_report(Path(out_dir), "librispeech", settings)
    if done is not None:
        return done
    pronunciations = Lexicon.load(lexicon_files) if lexicon_files else None
    root = find_subsets_root(corpus_dir)
    recordings, utterances, problems = [], [], []
    for subset, split in planned_subsets(root, train_subsets):
        subset_recordings, rows, subset_problems = read_subset(root / subset, split)
        recordings += subset_recordings
        problems += subset_problems
        if subset == MINI_EVALUATION_SUBSET:
            test_speakers = mini_test_speakers((row[2] for row in rows), read_speaker_sexes(root))
            rows = [("test" if speaker in test_speakers else "dev", utterance_id, speaker, tokens)
                    for _, utterance_id, speaker, tokens in rows]
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


from asr.evaluation.decoding.lexicon import LexiconFileError  # noqa: E402  (decoding files' errors)
from asr.evaluation.decoding.ngram import LanguageModelError  # noqa: E402

DEFAULT_OUT, MINI_OUT = "data/librispeech", "data/librispeech_mini"   # the presets' data.root
DOWNLOAD_OPTIONS = ("base_url", "download_dir", "md5_file", "keep_archives")


def download_corpus(args, out: Path) -> tuple[Path, tuple[str, ...]]:
    """--download: fetches the parts into the download folder; returns it and the training
    subsets to prepare (--train-subsets, else every training part complete there)."""
    parts = resolve_parts(args.download)
    download_dir = Path(args.download_dir) if args.download_dir else out / "download"
    there = set(completed_parts(download_dir))
    training = (*FULL_TRAIN_PARTS, MINI_TRAIN_SUBSET)
    if not set(parts) & set(training) and not there & set(training) and not args.train_subsets:
        raise DownloadRequestError(f"--download {' '.join(args.download)}: no training part; add mini, clean-100, "
                                   "clean-360, other-500 or all")
    md5 = read_md5_file(args.md5_file) if args.md5_file else None
    download_librispeech_parts(parts, download_dir, base_url=args.base_url, md5=md5,
                               keep_archives=args.keep_archives, progress=not args.no_progress)
    there = completed_parts(download_dir)
    return download_dir, tuple(args.train_subsets or [part for part in training if part in there])


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--corpus-dir", help="the LibriSpeech folder (holding train-clean-100/ ...)")
    source.add_argument("--download", nargs="+", metavar="PART", choices=list(DOWNLOAD_NAMES),
                        help="download these parts first, then prepare them: mini (OpenSLR 31: train-clean-5, "
                             "dev-clean-2), clean-100, clean-360, other-500 (each with dev-clean and test-clean), "
                             "dev, test, dev-other, test-other, all (the seven OpenSLR 12 parts), or lhotse's "
                             "part names (train-clean-100, ...); resumes an interrupted download")
    parser.add_argument("--out", default=None,
                        help=f"where the manifests go (default {DEFAULT_OUT}, or {MINI_OUT} with --download mini)")
    parser.add_argument("--train-subsets", nargs="+", default=None, choices=(*TRAIN_SUBSETS, MINI_TRAIN_SUBSET),
                        help="training subsets (default: all three of LibriSpeech 960 h; with --download, the "
                             f"training parts downloaded; {MINI_TRAIN_SUBSET}: mini LibriSpeech)")
    parser.add_argument("--base-url", default=OPENSLR, type=http_url,
                        help=f"OpenSLR's resources folder or a mirror's, as lhotse's base_url (default {OPENSLR}; "
                             "e.g. https://openslr.elda.org/resources)")
    parser.add_argument("--download-dir", default=None,
                        help="where the archives are downloaded and unpacked (default {out}/download)")
    parser.add_argument("--md5-file", default=None,
                        help="md5sum-format list ('<md5>  <name>.tar.gz') replacing the built-in published md5s")
    parser.add_argument("--keep-archives", action="store_true",
                        help="keep the .tar.gz files after unpacking (default: deleted once unpacked)")
    parser.add_argument("--lm-dir", default=None,
                        help="OpenSLR 11's folder (librispeech-lexicon.txt and the ARPA files): installs the "
                             "lexicon and --lm-name into --out for asr.evaluate decoder=lexicon")
    parser.add_argument("--lm-name", default="3-gram.pruned.1e-7.arpa.gz",
                        help="the ARPA file of --lm-dir to decode with (default 3-gram.pruned.1e-7.arpa.gz)")
    add_preparation_arguments(parser, lexicon="optional",
                              lexicon_help="CMUdict-format lexicon for phone targets (e.g. librispeech-lexicon.txt)")
    return parser


def output_folder(args) -> Path:
    """--out, else the presets' data.root: MINI_OUT for mini LibriSpeech, DEFAULT_OUT otherwise."""
    mini_names = {name for name, parts in DOWNLOAD_NAMES.items() if MINI_TRAIN_SUBSET in parts or
                  MINI_EVALUATION_SUBSET in parts}
    mini = bool(set(args.download or ()) & mini_names) or args.train_subsets == [MINI_TRAIN_SUBSET]
    return Path(args.out or (MINI_OUT if mini else DEFAULT_OUT))


def main(argv=None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not args.download:
        given = [f"--{name.replace('_', '-')}" for name in DOWNLOAD_OPTIONS
                 if getattr(args, name) != parser.get_default(name)]
        if given:
            parser.error(f"{', '.join(given)} go with --download")
    out = output_folder(args)

    def prepare():
        corpus_dir, train_subsets = Path(args.corpus_dir or "."), tuple(args.train_subsets or TRAIN_SUBSETS)
        if args.download:
            corpus_dir, train_subsets = download_corpus(args, out)
        report = prepare_librispeech(corpus_dir, out, train_subsets=train_subsets,
                                     lexicon=args.lexicon, extra_lexicon=args.extra_lexicon, oov_policy=args.oov,
                                     bad_data_policy=args.bad_data, jobs=args.jobs, progress=not args.no_progress)
        if args.lm_dir:
            from recipes.decoding_files import install_decoding_files
            lm_dir = Path(args.lm_dir)
            install_decoding_files(out, lm_dir / "librispeech-lexicon.txt", lm_dir / args.lm_name)
        return report

    def print_training_command(report):
        is_mini = report["settings"]["train_subsets"] == [MINI_TRAIN_SUBSET]
        preset, default_root = ("librispeech_mini_iclustered", MINI_OUT) if is_mini else \
            ("librispeech_iclustered", DEFAULT_OUT)
        root = "" if out == Path(default_root) else f" data.root={out}"
        print(f"train with: python -m asr.train conf={preset}{root}")

    return run_preparation("recipes.librispeech.prepare", prepare,
                           (LibriSpeechLayoutError, LanguageModelError, LexiconFileError, DownloadRequestError),
                           failures=(DownloadError, BadArchiveError), after=print_training_command,
                           resume_hint="run the same command again: it continues from the files downloaded or "
                                       "converted so far")


if __name__ == "__main__":
    sys.exit(main())

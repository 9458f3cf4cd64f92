"""TIMIT (LDC93S1) -> manifests: train (462 speakers), dev (50 speakers), core test (24 speakers).

Layout read (as on the LDC disc; upper or lower case, with or without a leading `data/` or
`timit/` folder):

    TRAIN/DR1/FCJF0/SI1027.WAV  .PHN  .WRD  .TXT
    TEST/DR1/FAKS0/...

- .WAV is NIST SPHERE (16 kHz, 16-bit); RIFF files of some re-distributions are read as well.
- .TXT: `<start> <end> <sentence>`; the sentence is normalised to lowercase words.
- .PHN: `<start> <end> <phone>` lines in TIMIT's 61 symbols; stored uppercase in
  `custom["phones"]` with `phone_set="timit61"`. Training uses the 61 phones; scoring folds hypothesis
  and reference to Lee & Hon's 39 classes (asr.text.phones.fold_timit_61_to_39).
- The SA sentences (SA1, SA2: the same two sentences read by every speaker) are left out, as is
  standard; `--include-sa` keeps them in train.
- dev: the 50-speaker development set of Halberstadt (1998), as in Kaldi's timit recipe; test:
  the 24-speaker core test set. Both come from TIMIT's TEST half and do not overlap.

Utterance ids are `<speaker>_<sentence>` in lowercase ("fcjf0_si1027").

    python -m recipes.timit.prepare --corpus-dir /data/TIMIT --out data/timit
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from asr.text.phones import TIMIT_61
from asr.data.audio.audio_source import AudioSource
from asr.data.corpus.manifest_builder import RecordingSpec, UtteranceSpec, build_manifests
from asr.data.corpus.preparation_report import Problem, previous_complete_report
from asr.text.normalisation import normalise_transcript
from recipes.preparation_command import add_preparation_arguments, run_preparation

CORE_TEST_SPEAKERS = frozenset(
    "mdab0 mwbt0 felc0 mtas1 mwew0 fpas0 mjmp0 mlnt0 fpkt0 mlll0 mtls0 fjlm0 "
    "mbpm0 mklt0 fnlp0 mcmj0 mjdh0 fmgd0 mgrt0 mnjm0 fdhc0 mjln0 mpam0 fmld0".split()
)
DEV_SPEAKERS = frozenset(
    "faks0 fdac1 fjem0 mgwt0 mjar0 mmdb1 mmdm2 mpdf0 fcmh0 fkms0 mbdg0 mbwm0 mcsh0 fadg0 fdms0 "
    "fedw0 mgjf0 mglb0 mrtk0 mtaa0 mtdt0 mthc0 mwjg0 fnmr0 frew0 fsem0 mbns0 mmjr0 mdls0 mdlf0 "
    "mdvc0 mers0 fmah0 fdrw0 mrcs0 mrjm4 fcal1 mmwh0 fjsj0 majc0 mjsw0 mreb0 fgjd0 fjmg0 mroa0 "
    "mteb0 mjfc0 mrjr0 fmml0 mrws1".split()
)


class TimitLayoutError(ValueError):
    """The corpus folder does not look like TIMIT."""


def find_timit_halves(corpus_dir: Path) -> dict[str, Path]:
    """{'train': .../TRAIN, 'test': .../TEST}, searched case-insensitively up to two folders down."""
    candidates = [corpus_dir] + [p for p in corpus_dir.iterdir() if p.is_dir()] if corpus_dir.is_dir() else []
    candidates += [p for c in candidates[1:] for p in c.iterdir() if p.is_dir()]
    for folder in candidates:
        halves = {p.name.lower(): p for p in folder.iterdir() if p.is_dir() and p.name.lower() in ("train", "test")}
        if len(halves) == 2:
            return halves
    raise TimitLayoutError(
        f"{corpus_dir}: no TIMIT TRAIN and TEST folders found (looked in it and two levels below); "
        "point --corpus-dir at the TIMIT folder of the LDC93S1 disc (the one holding TRAIN/ and TEST/)"
    )


def _files_by_stem(speaker_dir: Path) -> dict[str, dict[str, Path]]:
    """{'SI1027': {'.wav': path, '.phn': path, ...}}; a '.WAV.wav' twin (RIFF copies) counts as '.wav'."""
    stems: dict[str, dict[str, Path]] = {}
    for path in sorted(speaker_dir.iterdir()):
        name = path.name
        if name.lower().endswith(".wav.wav"):
            stem, extension = name[: -len(".wav.wav")], ".wav"
        else:
            stem, extension = path.stem, path.suffix.lower()
        if extension in (".wav", ".phn", ".txt", ".wrd"):
            stems.setdefault(stem.upper(), {}).setdefault(extension, path)
    return stems


def read_timit_utterances(corpus_dir: Path, include_sa: bool = False):
    halves = find_timit_halves(corpus_dir)
    recordings, utterances, problems = [], [], []
    allowed = set(TIMIT_61)
    for half, half_dir in sorted(halves.items()):
        for region in sorted(p for p in half_dir.iterdir() if p.is_dir() and p.name.lower().startswith("dr")):
            for speaker_dir in sorted(p for p in region.iterdir() if p.is_dir()):
                speaker = speaker_dir.name.lower()
                if half == "train":
                    split = "train"
                elif speaker in DEV_SPEAKERS:
                    split = "dev"
                elif speaker in CORE_TEST_SPEAKERS:
                    split = "test"
                else:
                    continue  # the rest of TIMIT's test half is in neither standard set
                for stem, files in _files_by_stem(speaker_dir).items():
                    if stem.startswith("SA") and not (include_sa and split == "train"):
                        continue
                    utterance_id = f"{speaker}_{stem.lower()}"
                    missing = [ext for ext in (".wav", ".phn", ".txt") if ext not in files]
                    if missing:
                        kind = "missing_audio" if ".wav" in missing else "missing_transcript"
                        problems.append(Problem(kind, utterance_id,
                                                f"{speaker_dir / stem}: no {' / '.join(m.upper() for m in missing)} file"))
                        continue
                    phones = [line.split()[2].upper() for line in _lines(files[".phn"]) if len(line.split()) == 3]
                    unknown = sorted(set(phones) - allowed)
                    if unknown or not phones:
                        problems.append(Problem("bad_transcript", utterance_id,
                                                f"{files['.phn']}: not TIMIT phones: {unknown or 'none at all'}"))
                        continue
                    sentence = " ".join(" ".join(_lines(files[".txt"])).split()[2:])
                    recordings.append(RecordingSpec(utterance_id, AudioSource(path=str(files[".wav"]))))
                    utterances.append(UtteranceSpec(
                        id=utterance_id, split=split, recording_id=utterance_id, speaker=speaker,
                        text=normalise_transcript(sentence.split()), phones=" ".join(phones),
                    ))
    return recordings, utterances, problems


def _lines(path: Path) -> list[str]:
    return [line.strip() for line in path.read_text(encoding="latin-1").splitlines() if line.strip()]


def prepare_timit(corpus_dir, out_dir, *, include_sa: bool = False, bad_data_policy: str = "error",
                  jobs: int | None = None, progress: bool = True) -> dict:
    """Prepare TIMIT's train/dev/test manifests under out_dir; returns the report (see manifest_builder)."""
    corpus_dir = Path(corpus_dir).resolve()
    settings = {"recipe": "timit", "corpus_dir": str(corpus_dir), "include_sa": include_sa,
                "bad_data_policy": bad_data_policy}
    done = previous_complete_report(Path(out_dir), "timit", settings)
    if done is not None:
        return done
    recordings, utterances, problems = read_timit_utterances(corpus_dir, include_sa)
    return build_manifests("timit", out_dir, recordings, utterances, problems, settings=settings,
                           bad_data_policy=bad_data_policy, phone_set="timit61", jobs=jobs, progress=progress)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--corpus-dir", required=True, help="the TIMIT folder (holding TRAIN/ and TEST/)")
    parser.add_argument("--out", default="data/timit", help="where the manifests and audio go (default data/timit)")
    parser.add_argument("--include-sa", action="store_true", help="keep the SA1/SA2 sentences in train")
    add_preparation_arguments(parser)
    args = parser.parse_args(argv)
    return run_preparation(
        "recipes.timit.prepare",
        lambda: prepare_timit(args.corpus_dir, args.out, include_sa=args.include_sa,
                              bad_data_policy=args.bad_data, jobs=args.jobs, progress=not args.no_progress),
        (TimitLayoutError,))


if __name__ == "__main__":
    sys.exit(main())

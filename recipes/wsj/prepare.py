"""Wall Street Journal (WSJ0 LDC93S6B + WSJ1 LDC94S13B) -> manifests with phone and word targets.

Splits, as in Kaldi's wsj/s5 and the clustered-attention paper: train = train_si284 (37416
utterances, about 81 h; `--train-set si84` for the 7138-utterance WSJ0 part), dev = test_dev93
(503), test = test_eval92 (333).

Two ways in, chosen from what `--corpus-dir` holds:

1. A Kaldi data directory (the `data/` folder made by egs/wsj/s5/local/wsj_data_prep.sh and
   wsj_format_data.sh): `train_si284/`, `test_dev93/`, `test_eval92/`, each with `wav.scp` (entries
   such as `sph2pipe -f wav /corpus/11-1.1/wsj0/si_tr_s/011/011c0201.wv1 |`), `text`, `utt2spk`.
   Those `|` lines are shell commands, so they are read only with `--allow-commands` (give it for
   a folder you trust; each command is logged the first time it runs). sph2pipe commands work
   without sph2pipe (we read the SPHERE file they name); other commands are run as written.
2. The LDC disc folders themselves (`11-1.1/`, ..., `13-34.1/`, found anywhere up to three folders
   below each `--corpus-dir`; give both the wsj0 and the wsj1 folders). The utterance lists come from
   the discs' index files, as in Kaldi:
       train si84:  11-13.1/wsj0/doc/indices/train/tr_s_wv1.ndx (minus 11-2.1/wsj0/si_tr_s/401)
       train si284: si84 + 13-34.1/wsj1/doc/indices/si_tr_s.ndx
       dev93:       13-34.1/wsj1/doc/indices/h1_p0.ndx
       eval92:      11-13.1/wsj0/doc/indices/test/nvp/si_et_20.ndx
   Transcripts come from the `.dot` files (`<words> (<utterance-id>)` per line), or from `.lsn`
   files in the same line format where no `.dot` line exists. File names are matched
   case-insensitively (disc 13-16.1 was pressed in uppercase).

Audio: `.wv1` files are NIST SPHERE, mostly shorten-compressed; they are decoded with sph2pipe
when it is on PATH, else ffmpeg (`apt-get install ffmpeg`), and converted once to 16 kHz FLAC
under `<out>/audio/`.

Transcripts are normalised as Kaldi's local/normalize_transcript.pl does, except that noise is
removed instead of becoming <NOISE>: noise marks ([door_slam], [<breath], [/phone_ring], ~, .)
and Kaldi's <NOISE>/<SPOKEN_NOISE> are dropped; <word> (a verbal deletion, still spoken) and
*word* (mispronounced) become the word; backslashes are removed; --DASH is -DASH. Verbalised
punctuation (,COMMA .PERIOD "DOUBLE-QUOTE) is a spoken word: its pronunciation comes from the
lexicon entry for the written form, its text is the plain word ("comma", "double quote").

Phone targets: from a CMUdict-format lexicon (`--lexicon`, required; stress removed, 39 phones).
Words missing from it are listed in the report; `--oov error` (default) stops before writing
manifests, `--oov drop` leaves those utterances out, and `--extra-lexicon FILE` adds pronunciations.

    python -m recipes.wsj.prepare --corpus-dir /data/LDC93S6B /data/LDC94S13B \\
        --lexicon /data/cmudict-0.7b --out data/wsj
    python -m recipes.wsj.prepare --corpus-dir ~/kaldi/egs/wsj/s5/data --lexicon cmudict-0.7b --out data/wsj \\
        --allow-commands
"""

from __future__ import annotations

import argparse
import os
import re
import sys
from pathlib import Path

from asr.data.audio.audio_source import AudioSource
from asr.data.corpus.kaldi_dir import KaldiDataDirError, read_kaldi_data_dir
from asr.data.corpus.manifest_builder import RecordingSpec, UtteranceSpec, build_manifests, file_identity
from asr.data.corpus.preparation_report import Problem, previous_complete_report
from asr.text.normalisation import normalise_transcript
from recipes.lexicon import Lexicon
from recipes.preparation_command import add_preparation_arguments, run_preparation

TRAIN_SETS = ("si284", "si84")
# Kaldi data directory names of each split.
KALDI_SETS = {"train": "train_{train_set}", "dev": "test_dev93", "test": "test_eval92"}
# LDC index files (relative to any disc folder) listing each set's utterances.
INDEX_FILES = {
    "si84": ["wsj0/doc/indices/train/tr_s_wv1.ndx"],
    "si284": ["wsj0/doc/indices/train/tr_s_wv1.ndx", "wsj1/doc/indices/si_tr_s.ndx"],
    "dev93": ["wsj1/doc/indices/h1_p0.ndx"],
    "eval92": ["wsj0/doc/indices/test/nvp/si_et_20.ndx"],
}
# Kaldi leaves this speaker out of SI-84/SI-284 (its recordings duplicate another speaker's).
EXCLUDED_TRAIN_PREFIX = ("11_2_1", "wsj0/si_tr_s/401")
DISC_FOLDER = re.compile(r"^\d{2}-\d{1,2}\.\d$")
TRANSCRIPT_LINE = re.compile(r"^(.*)\((\w{8})\)\s*$")
NOISE_WORDS = {"<NOISE>", "<SPOKEN_NOISE>", "<SIL>", "~", "."}


class WsjLayoutError(ValueError):
    """The corpus folders hold neither a Kaldi data directory nor the LDC discs."""


def clean_wsj_tokens(tokens) -> list[str]:
    """WSJ transcript markup -> spoken words as written (see the module docstring)."""
    words = []
    for token in tokens:
        token = token.replace("\\", "").upper()
        if token in NOISE_WORDS or (token.startswith("[") and token.endswith("]")):
            continue  # [noise], [<noise], [noise>], [noise/], [/noise]
        if token.startswith("<") and token.endswith(">"):
            token = token[1:-1]  # verbal deletion: spoken, then retracted
        if len(token) > 2 and token.startswith("*") and token.endswith("*"):
            token = token[1:-1]  # mispronounced
        if token == "--DASH":
            token = "-DASH"
        if token:
            words.append(token)
    return words


# ----------------------------------------------------------------------------- Kaldi data dirs
def is_kaldi_layout(corpus_dirs: list[Path], train_set: str) -> bool:
    return any((d / KALDI_SETS["train"].format(train_set=train_set) / "wav.scp").is_file() for d in corpus_dirs)


def read_kaldi_sets(corpus_dirs: list[Path], train_set: str, allow_commands: bool = False):
    recordings, utterances, problems = [], [], []
    for split, pattern in KALDI_SETS.items():
        name = pattern.format(train_set=train_set)
        folders = [d / name for d in corpus_dirs if (d / name).is_dir()]
        if not folders:
            raise WsjLayoutError(f"Kaldi data directory {name}/ not found in {', '.join(map(str, corpus_dirs))}")
        data = read_kaldi_data_dir(folders[0], allow_commands=allow_commands, allow_option="--allow-commands")
        problems += [Problem(kind, item, f"{data.path}: {message}") for kind, item, message in data.problems]
        for recording_id, source in data.recordings.items():
            recordings.append(RecordingSpec(recording_id, source))
        for utterance in data.utterances:
            utterances.append((split, utterance.id, utterance.recording_id, utterance.speaker,
                               utterance.words, utterance.start, utterance.end))
    return recordings, utterances, problems


# ----------------------------------------------------------------------------- LDC discs
class CaseInsensitiveTree:
    """Resolves 'wsj0/si_tr_s/01i/01ic0201.wv1' under a disc folder whatever the case on disk."""

    def __init__(self):
        self._listings: dict[Path, dict[str, str]] = {}

    def resolve(self, base: Path, relative: str) -> Path | None:
        path = base
        for part in relative.strip("/").split("/"):
            if part in ("", "."):
                continue
            if path not in self._listings:
                try:
                    self._listings[path] = {name.lower(): name for name in os.listdir(path)}
                except (FileNotFoundError, NotADirectoryError):
                    return None
            name = self._listings[path].get(part.lower())
            if name is None:
                return None
            path = path / name
        return path


def find_discs(corpus_dirs: list[Path]) -> dict[str, Path]:
    """{'11_1_1': /data/wsj0/11-1.1, ...}: disc folders up to three levels below each corpus dir."""
    discs = {}
    for root in corpus_dirs:
        for folder, subfolders, _ in os.walk(root):
            depth = len(Path(folder).relative_to(root).parts)
            for name in subfolders:
                if DISC_FOLDER.match(name):
                    discs.setdefault(name.replace("-", "_").replace(".", "_"), Path(folder) / name)
            if depth >= 2:
                subfolders[:] = []
            else:
                subfolders[:] = [s for s in subfolders if not DISC_FOLDER.match(s)]
    return discs


def read_index(discs: dict[str, Path], tree: CaseInsensitiveTree, relative: str) -> list[tuple[str, str]]:
    """[(disc id, path inside the disc), ...] from the index file found in any disc."""
    for disc in discs.values():
        index = tree.resolve(disc, relative)
        if index is not None and index.is_file():
            break
    else:
        raise WsjLayoutError(
            f"WSJ index file {relative} not found in any disc folder ({', '.join(sorted(discs)) or 'none found'}); "
            "pass the folders holding both the WSJ0 (LDC93S6B) and WSJ1 (LDC94S13B) discs to --corpus-dir"
        )
    entries = []
    for number, line in enumerate(index.read_text(encoding="latin-1").splitlines(), start=1):
        line = line.strip()
        if not line or line.startswith(";"):
            continue
        match = re.match(r"^([0-9_]+):\s*(\S+)$", line)
        if not match:
            raise WsjLayoutError(f"{index}:{number}: expected '<disc>:<path>', got {line!r}")
        disc, path = match.groups()
        if not path.lower().endswith((".wv1", ".wv2")):
            path += ".wv1"  # the eval92 index lists paths without the extension
        entries.append((disc, path))
    return entries


def read_transcripts(discs: dict[str, Path]) -> dict[str, list[str]]:
    """{utterance id: raw tokens} from every .dot file, then .lsn files for utterances still missing."""
    found: dict[str, list[Path]] = {".dot": [], ".lsn": []}
    for disc in discs.values():
        for folder, _, files in os.walk(disc):
            for name in files:
                extension = os.path.splitext(name)[1].lower()
                if extension in found:
                    found[extension].append(Path(folder) / name)
    transcripts: dict[str, list[str]] = {}
    for extension in (".dot", ".lsn"):
        for path in sorted(found[extension]):
            for line in path.read_text(encoding="latin-1").splitlines():
                match = TRANSCRIPT_LINE.match(line)
                if match:
                    transcripts.setdefault(match.group(2).lower(), match.group(1).split())
    return transcripts


def read_ldc_sets(corpus_dirs: list[Path], train_set: str):
    discs = find_discs(corpus_dirs)
    if not discs:
        raise WsjLayoutError(
            f"no WSJ disc folders (named like 11-1.1 or 13-34.1) and no Kaldi data directory "
            f"(train_{train_set}/wav.scp) under {', '.join(map(str, corpus_dirs))}"
        )
    tree = CaseInsensitiveTree()
    transcripts = read_transcripts(discs)
    recordings, utterances, problems = [], [], []
    seen = set()
    for split, set_name in (("train", train_set), ("dev", "dev93"), ("test", "eval92")):
        for relative_index in INDEX_FILES[set_name]:
            for disc_id, relative in read_index(discs, tree, relative_index):
                if split == "train" and (disc_id, relative.lower().rsplit("/", 1)[0]) == EXCLUDED_TRAIN_PREFIX:
                    continue
                utterance_id = Path(relative).stem.lower()
                if utterance_id in seen:
                    continue
                seen.add(utterance_id)
                disc = discs.get(disc_id)
                audio = tree.resolve(disc, relative) if disc is not None else None
                if audio is None:
                    where = f"{disc}/{relative}" if disc is not None else f"disc {disc_id} (not found), {relative}"
                    problems.append(Problem("missing_audio", utterance_id, f"{utterance_id}: {where}: file not found"))
                    continue
                if utterance_id not in transcripts:
                    problems.append(Problem("missing_transcript", utterance_id,
                                            f"{utterance_id}: no line in any .dot/.lsn transcript file"))
                    continue
                recordings.append(RecordingSpec(utterance_id, AudioSource(path=str(audio))))
                utterances.append((split, utterance_id, utterance_id, utterance_id[:3],
                                   tuple(transcripts[utterance_id]), 0.0, None))
    return recordings, utterances, problems


# ----------------------------------------------------------------------------- the recipe
def prepare_wsj(corpus_dirs, out_dir, lexicon, *, extra_lexicon=(), train_set: str = "si284",
                oov_policy: str = "error", bad_data_policy: str = "error", jobs: int | None = None,
                progress: bool = True, allow_commands: bool = False) -> dict:
    """Prepare WSJ's train/dev/test manifests under out_dir; returns the report (see manifest_builder).

    corpus_dirs: one or more folders (a Kaldi `data/` folder, or folders holding the LDC discs).
    allow_commands: run a Kaldi wav.scp's `... |` commands (else KaldiDataDirError naming the line).
    lexicon / extra_lexicon: CMUdict-format files; extra entries override the main lexicon.
    """
    if train_set not in TRAIN_SETS:
        raise ValueError(f"train_set={train_set!r}: must be one of {TRAIN_SETS}")
    if isinstance(corpus_dirs, (str, Path)):
        corpus_dirs = [corpus_dirs]
    corpus_dirs = [Path(d).resolve() for d in corpus_dirs]
    for folder in corpus_dirs:
        if not folder.is_dir():
            raise WsjLayoutError(f"--corpus-dir {folder} is not a folder")
    if isinstance(extra_lexicon, (str, Path)):
        extra_lexicon = [extra_lexicon]
    lexicon_files = [Path(lexicon).resolve()] + [Path(p).resolve() for p in extra_lexicon]
    settings = {
        "recipe": "wsj", "corpus_dirs": [str(d) for d in corpus_dirs], "train_set": train_set,
        "lexicons": [file_identity(p) for p in lexicon_files],
        "oov_policy": oov_policy, "bad_data_policy": bad_data_policy,
    }
    done = previous_complete_report(Path(out_dir), "wsj", settings)
    if done is not None:
        return done
    pronunciations = Lexicon.load(lexicon_files)
    if is_kaldi_layout(corpus_dirs, train_set):
        recordings, rows, problems = read_kaldi_sets(corpus_dirs, train_set, allow_commands)
    else:
        recordings, rows, problems = read_ldc_sets(corpus_dirs, train_set)
    utterances = []
    for split, utterance_id, recording_id, speaker, raw_tokens, start, end in rows:
        tokens = clean_wsj_tokens(raw_tokens)
        phones, missing = pronunciations.pronounce(tokens)
        utterances.append(UtteranceSpec(
            id=utterance_id, split=split, recording_id=recording_id, speaker=speaker,
            text=normalise_transcript(tokens), start=start, end=end,
            phones=" ".join(phones), oov_words=tuple(missing),
        ))
    return build_manifests("wsj", out_dir, recordings, utterances, problems, settings=settings,
                           oov_policy=oov_policy, bad_data_policy=bad_data_policy, phone_set="arpabet39",
                           jobs=jobs, progress=progress)


from asr.evaluation.decoding.lexicon import LexiconFileError  # noqa: E402  (decoding files' errors)
from asr.evaluation.decoding.ngram import LanguageModelError  # noqa: E402


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--corpus-dir", nargs="+", required=True,
                        help="a Kaldi data/ folder, or the folders holding the WSJ0 and WSJ1 LDC discs")
    parser.add_argument("--out", default="data/wsj", help="where the manifests and audio go (default data/wsj)")
    parser.add_argument("--train-set", choices=TRAIN_SETS, default="si284")
    parser.add_argument("--lm", default=None,
                        help="an ARPA LM for lexicon decoding, e.g. WSJ1's 20k closed-vocabulary trigram "
                             "13-32.1/wsj1/doc/lng_modl/base_lm/tcb20onp.z; installed into --out with the lexicon "
                             "restricted to its vocabulary")
    parser.add_argument("--allow-commands", action="store_true",
                        help="run the shell commands of a Kaldi wav.scp (lines ending in '|'); give it only for a "
                             "folder you trust")
    add_preparation_arguments(parser, lexicon="required", lexicon_help="CMUdict-format lexicon (e.g. cmudict-0.7b)")
    args = parser.parse_args(argv)

    def prepare():
        report = prepare_wsj(args.corpus_dir, args.out, args.lexicon, extra_lexicon=args.extra_lexicon,
                             train_set=args.train_set, oov_policy=args.oov, bad_data_policy=args.bad_data,
                             jobs=args.jobs, progress=not args.no_progress, allow_commands=args.allow_commands)
        if args.lm:
            from recipes.decoding_files import install_decoding_files
            install_decoding_files(args.out, [args.lexicon, *(args.extra_lexicon or [])], args.lm)
        return report
    return run_preparation("recipes.wsj.prepare", prepare,
                           (WsjLayoutError, KaldiDataDirError, LanguageModelError, LexiconFileError))


if __name__ == "__main__":
    sys.exit(main())

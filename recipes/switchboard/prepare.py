"""Switchboard-1 Release 2 (LDC97S62) with the Mississippi State (ms98) transcripts -> manifests of
conversation-side segments with word targets (sentencepiece pieces are trained by asr.data).

Layout read:

    <corpus-dir>/**/sw02001.sph             two-channel 8 kHz mu-law SPHERE, one file per conversation
    <transcripts-dir>/**/sw2001A-ms98-a-trans.text
        sw2001A-ms98-a-0001 0.000000 0.977625 [silence]
        sw2001A-ms98-a-0002 0.977625 11.561375 hi um yeah i'd like to talk about how you dress for work and

`--transcripts-dir` is the unpacked swb_ms98_transcriptions folder (ISIP's
switchboard_word_alignments.tar.gz); it defaults to `--corpus-dir`. Side A is channel 1 of the
SPHERE file, side B channel 2 (0 and 1 here).

Audio: each conversation side becomes one recording `sw02001-A`, converted once to 16 kHz mono
FLAC (upsampled from 8 kHz so that it has the sampling rate of every other corpus; the upper half
of the spectrum is empty). mu-law SPHERE is decoded here; shorten-compressed mu-law needs LDC's
sph2pipe on PATH (ffmpeg cannot decode it), and the message says so. Each transcript segment is a
cut of its side's recording, with the segment's start and end times.

Words (decisions; Kaldi's swbd1 preparation keeps some of these as special words instead):
- [silence] [noise] [laughter] [vocalized-noise] and <b_aside>/<e_aside> marks are not words:
  removed; segments left with no words are skipped;
- [laughter-yes] (a word spoken laughing) -> yes; [bocket/bucket] (said / meant) -> bucket, the
  word meant, as WSJ's *mispronounced* words;
- partial words (th[e]-, -[th]at, ex-) are removed: they are not words a WER can score;
- alternate-pronunciation suffixes (them_1) are removed; curly braces are dropped.

Splits: Switchboard-1 has no official dev/test inside it (the usual test set, Hub5'00 /
eval2000, is the separate LDC2002S09/LDC2002T43). Like Kaldi's train_dev, held-out conversations
are taken from the start of the sorted list: the first `--dev-conversations` (default 40) are dev,
the next `--test-conversations` (default 40) test, the rest train. Speakers are conversation sides.

    python -m recipes.switchboard.prepare --corpus-dir /data/LDC97S62 \\
        --transcripts-dir /data/swb_ms98_transcriptions --out data/switchboard
"""

from __future__ import annotations

import argparse
import re
import sys
from collections import defaultdict
from pathlib import Path

from asr.data.audio.audio_source import AudioSource
from asr.data.corpus.manifest_builder import RecordingSpec, UtteranceSpec, build_manifests, file_identity
from asr.data.corpus.preparation_report import Problem, previous_complete_report
from asr.text.normalisation import normalise_transcript
from recipes.lexicon import Lexicon
from recipes.preparation_command import add_preparation_arguments, run_preparation

NON_SPEECH = {"[silence]", "[noise]", "[laughter]", "[vocalized-noise]"}
TRANSCRIPT_NAME = re.compile(r"^sw(\d{4})([AB])-ms98-a-trans\.text$", re.IGNORECASE)


class SwitchboardLayoutError(ValueError):
    """No audio or no transcripts where they were looked for."""


def clean_ms98_tokens(tokens) -> list[str]:
    """ms98 transcript words -> spoken words (see the module docstring)."""
    words = []
    for token in tokens:
        token = token.lower()
        if token in NON_SPEECH or (token.startswith("<") and token.endswith(">")):
            continue
        laughing = re.fullmatch(r"\[laughter-(.+)\]", token)
        if laughing:
            token = laughing.group(1)
        mispronounced = re.fullmatch(r"\[[^/\]]*/([^\]]+)\]", token)
        if mispronounced:
            token = mispronounced.group(1)
        if token.startswith("-") or token.endswith("-") or "[" in token:
            continue  # a partial word
        token = re.sub(r"_\d+$", "", token).replace("{", "").replace("}", "")
        if token:
            words.append(token)
    return words


def read_ms98_transcripts(transcripts_dir: Path) -> dict[tuple[str, str], Path]:
    """{('2001', 'A'): path of sw2001A-ms98-a-trans.text, ...}"""
    found = {}
    for path in sorted(transcripts_dir.rglob("*")):
        match = TRANSCRIPT_NAME.match(path.name)
        if match:
            found.setdefault((match.group(1), match.group(2).upper()), path)
    return found


def find_audio_and_transcripts(corpus_dir: Path, transcripts_dir: Path
                               ) -> tuple[dict[str, Path], dict[tuple[str, str], Path]]:
    """The .sph files by conversation ('sw02001') and the ms98 transcripts by (number, side); finding
    none of either is a SwitchboardLayoutError saying where to point."""
    audio = {p.stem.lower(): p for p in corpus_dir.rglob("*") if p.suffix.lower() == ".sph"}
    transcripts = read_ms98_transcripts(transcripts_dir)
    if not audio:
        raise SwitchboardLayoutError(f"no .sph files under {corpus_dir}: point --corpus-dir at the LDC97S62 audio")
    if not transcripts:
        raise SwitchboardLayoutError(
            f"no ms98 transcripts (sw2001A-ms98-a-trans.text ...) under {transcripts_dir}: unpack ISIP's "
            "switchboard_word_alignments.tar.gz and pass its swb_ms98_transcriptions folder as --transcripts-dir"
        )
    return audio, transcripts


def conversation_splits(transcripts: dict[tuple[str, str], Path], dev_conversations: int,
                        test_conversations: int) -> dict[str, str]:
    """Conversation number -> split, in the sorted list: the first dev_conversations dev, the next
    test_conversations test, the rest train (the module docstring's Splits)."""
    conversations = sorted({number for number, _ in transcripts})
    split_of = {}
    for index, number in enumerate(conversations):
        split_of[number] = ("dev" if index < dev_conversations
                            else "test" if index < dev_conversations + test_conversations else "train")
    return split_of


def read_side_utterances(path: Path, recording_id: str, split: str, pronunciations: Lexicon | None,
                         problems: list[Problem]) -> list[UtteranceSpec]:
    """The segments of one side's ms98 transcript that hold words; a malformed line is added to
    `problems` (bad_transcript)."""
    utterances = []
    for line_number, line in enumerate(path.read_text(encoding="latin-1").splitlines(), start=1):
        fields = line.split()
        if not fields:
            continue
        try:
            segment_id, start, end = fields[0], float(fields[1]), float(fields[2])
        except (IndexError, ValueError):
            problems.append(Problem("bad_transcript", f"{path.name}:{line_number}",
                                    f"{path}:{line_number}: expected '<id> <start> <end> <words>', got {line!r}"))
            continue
        tokens = clean_ms98_tokens(fields[3:])
        if not tokens:
            continue  # silence or noise only
        phones, oov = pronunciations.pronounce(tokens) if pronunciations else (None, [])
        utterances.append(UtteranceSpec(
            id=segment_id, split=split, recording_id=recording_id, speaker=recording_id,
            text=normalise_transcript(tokens), start=start, end=end,
            phones=" ".join(phones) if phones is not None else None, oov_words=tuple(oov),
        ))
    return utterances


def conversations_without_transcripts(audio: dict[str, Path], transcripts: dict[tuple[str, str], Path],
                                      transcripts_dir: Path) -> list[Problem]:
    """A missing_transcript problem for each conversation with audio but no transcript of either side."""
    sides = defaultdict(set)
    for number, side in transcripts:
        sides[f"sw0{number}"].add(side)
    return [Problem("missing_transcript", conversation,
                    f"{audio[conversation]}: no ms98 transcript for either side under {transcripts_dir}")
            for conversation in sorted(set(audio) - set(sides))]


def prepare_switchboard(corpus_dir, out_dir, *, transcripts_dir=None, dev_conversations: int = 40,
                        test_conversations: int = 40, lexicon=None, extra_lexicon=(), oov_policy: str = "error",
                        bad_data_policy: str = "error", jobs: int | None = None, progress: bool = True) -> dict:
    """Prepare Switchboard manifests under out_dir; returns the report (see manifest_builder)."""
    corpus_dir = Path(corpus_dir).resolve()
    transcripts_dir = Path(transcripts_dir).resolve() if transcripts_dir else corpus_dir
    for name, folder in (("--corpus-dir", corpus_dir), ("--transcripts-dir", transcripts_dir)):
        if not folder.is_dir():
            raise SwitchboardLayoutError(f"{name} {folder} is not a folder")
    lexicon_files = ([Path(lexicon)] if lexicon else []) + [Path(p) for p in extra_lexicon]
    settings = {"recipe": "switchboard", "corpus_dir": str(corpus_dir), "transcripts_dir": str(transcripts_dir),
                "dev_conversations": dev_conversations, "test_conversations": test_conversations,
                "lexicons": [file_identity(p) for p in lexicon_files],
                "oov_policy": oov_policy, "bad_data_policy": bad_data_policy}
    done = previous_complete_report(Path(out_dir), "switchboard", settings)
    if done is not None:
        return done
    pronunciations = Lexicon.load(lexicon_files) if lexicon_files else None

    audio, transcripts = find_audio_and_transcripts(corpus_dir, transcripts_dir)
    split_of = conversation_splits(transcripts, dev_conversations, test_conversations)

    recordings, utterances, problems = [], [], []
    for (number, side), path in sorted(transcripts.items()):
        conversation = f"sw0{number}"
        recording_id = f"{conversation}-{side}"
        if conversation not in audio:
            problems.append(Problem("missing_audio", recording_id, f"{recording_id}: {conversation}.sph not found "
                                    f"under {corpus_dir} (transcript {path})"))
            continue
        recordings.append(RecordingSpec(recording_id, AudioSource(path=str(audio[conversation]),
                                                                  channel=0 if side == "A" else 1)))
        utterances += read_side_utterances(path, recording_id, split_of[number], pronunciations, problems)
    problems += conversations_without_transcripts(audio, transcripts, transcripts_dir)
    return build_manifests("switchboard", out_dir, recordings, utterances, problems, settings=settings,
                           oov_policy=oov_policy, bad_data_policy=bad_data_policy,
                           phone_set="arpabet39" if pronunciations else None, jobs=jobs, progress=progress)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--corpus-dir", required=True, help="the LDC97S62 folder (its .sph files, at any depth)")
    parser.add_argument("--transcripts-dir", help="the swb_ms98_transcriptions folder (default: --corpus-dir)")
    parser.add_argument("--out", default="data/switchboard", help="where the manifests and audio go")
    parser.add_argument("--dev-conversations", type=int, default=40, help="held-out conversations for dev")
    parser.add_argument("--test-conversations", type=int, default=40, help="held-out conversations for test")
    add_preparation_arguments(parser, lexicon="optional", lexicon_help="CMUdict-format lexicon, for phone targets")
    args = parser.parse_args(argv)
    return run_preparation(
        "recipes.switchboard.prepare",
        lambda: prepare_switchboard(args.corpus_dir, args.out, transcripts_dir=args.transcripts_dir,
                                    dev_conversations=args.dev_conversations,
                                    test_conversations=args.test_conversations, lexicon=args.lexicon,
                                    extra_lexicon=args.extra_lexicon, oov_policy=args.oov,
                                    bad_data_policy=args.bad_data, jobs=args.jobs, progress=not args.no_progress),
        (SwitchboardLayoutError,))


if __name__ == "__main__":
    sys.exit(main())

"""The training data of an adaptation run: a user's Kaldi-style folders -> manifests that asr.data reads.

    python -m asr.train conf=adapt init_from=RUN adapt.data_dir=my_voice/     (asr.training.adaptation)

`prepare_adaptation_data(folders, out_dir, ...)` writes corpus `adapt` (ADAPTATION_CORPUS) into
`out_dir` (by default `<data_dir>/asr_adapt`): splits `train` and `dev`, and `test` when a test folder
is given, with the audio converted once to 16 kHz FLAC (asr.data.corpus.manifest_builder, as every recipe).

- Folders: `data_dir` (wav.scp and text; utt2spk and segments optional, as asr.evaluate's data_dir=)
  is the training data. Validation is a second folder (`dev_data_dir`) or, without one, a held-out
  share of data_dir's utterances (`held_out_texts`: whole sentences, seeded, so a sentence read twice
  is never on both sides). The ids of a dev or test folder get the prefix `dev-` / `test-`, so two
  folders may use the same names.
- Words: normalised as the recipes' transcripts (asr.text.normalisation: lowercase a-z and
  apostrophes; digits dropped, so write numbers as words).
- Phones (only for a model with a phone head): espeak-ng en-us's ARPABET_39 phones of the whole
  normalised transcript (asr.evaluation.decoding.pronunciation.espeak_sentence_phones). That is how the
  asterisk set's references and three quarters of the synth corpus's targets are made, so the model
  is adapted towards the transcription conventions it was trained on. An utterance espeak-ng says with
  a sound outside ARPAbet is left out and counted (`unmappable_phoneme`).
- Resumption: a preparation with the same folders (their files' size and time) and settings is
  not redone; another held-out share rewrites the manifests and reuses the converted audio.
- Rehearsal (`adapt.rehearsal` > 0, `write_rehearsal_split`): the training split becomes
  `train_rehearsal`, the train split's utterances followed by utterances of the trained model's own
  training data (`adapt.rehearsal_cuts`) whose duration is `adapt.rehearsal` times theirs, so the
  model keeps hearing the voices it was trained on while it learns yours. Decisions: the sample is
  fixed for the run (not drawn afresh each epoch), chosen by a hash of (seed, cut id), so it does
  not depend on the manifest's order and streams through a manifest of any size; its ids get the
  prefix `rehearsal-`, so they never meet your ids; relative audio paths are made absolute.
"""
from __future__ import annotations

import gzip
import hashlib
import heapq
import json
import logging
import os
import random
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from tqdm.auto import tqdm

from asr.data.corpus.manifests import cuts_path, make_sources_absolute

ADAPTATION_CORPUS = "adapt"
TRAIN, DEV, TEST = "train", "dev", "test"
PHONE_SET = "arpabet39"
ESPEAK_VOICE = "en-us"
UNMAPPABLE_PHONEME = "unmappable_phoneme"
REHEARSAL_SPLIT = "train_rehearsal"   # the training split of a run with adapt.rehearsal > 0
REHEARSAL_PREFIX = "rehearsal-"

log = logging.getLogger("asr.train")


class AdaptationDataError(ValueError):
    """A folder that cannot be adaptation data; the message names the option and what to do."""


@dataclass(frozen=True)
class AdaptationFolders:
    """The Kaldi-style folders of an adaptation run, by the option that named them."""
    train: str                      # adapt.data_dir
    dev: str | None = None          # adapt.dev_data_dir (None: a held-out share of train)
    test: str | None = None         # adapt.test_data_dir (None: no test split)

    def named(self) -> list[tuple[str, str, str]]:
        """(option, split, folder) of every folder given."""
        return [(f"adapt.{option}", split, folder) for option, split, folder in
                (("data_dir", TRAIN, self.train), ("dev_data_dir", DEV, self.dev),
                 ("test_data_dir", TEST, self.test)) if folder is not None]


def held_out_texts(texts: list[str], fraction: float, seed: int) -> set[str]:
    """The sentences whose utterances are held out for validation: distinct texts in an order drawn
    with `seed`, taken until they hold at least `fraction` of the utterances (at least one), never all."""
    counts = Counter(texts)
    if len(counts) < 2:
        raise AdaptationDataError(f"adapt.data_dir has {len(texts)} utterance(s) of {len(counts)} distinct "
                                  "sentence(s): holding some out for validation needs two sentences or more; "
                                  "record more, or give a validation folder with adapt.dev_data_dir=")
    order = sorted(counts)
    random.Random(seed).shuffle(order)
    wanted = max(1, round(fraction * len(texts)))
    chosen, held = set(), 0
    for text in order:
        if held >= wanted or held + counts[text] == len(texts):
            break
        chosen.add(text)
        held += counts[text]
    return chosen


def sentence_phones(texts: list[str], progress: bool) -> list[str | Exception]:
    """Per text, espeak-ng en-us's ARPABET_39 phones as one string, or the UnmappablePhonemeError."""
    from asr.evaluation.decoding.pronunciation import espeak_sentence_phones
    from asr.text.synthesiser_phonemes import UnmappablePhonemeError

    def phones(text: str):
        try:
            return " ".join(espeak_sentence_phones(text, ESPEAK_VOICE))
        except UnmappablePhonemeError as error:
            return error

    with ThreadPoolExecutor(max_workers=min(4, os.cpu_count() or 1)) as pool:   # each call waits on espeak-ng
        return list(tqdm(pool.map(phones, texts), total=len(texts), desc=f"{ADAPTATION_CORPUS}: phones",
                         unit="utt", disable=not progress))


def _read_folder(option: str, folder: str, allow_commands: bool = False):
    from asr.data.corpus.kaldi_dir import KaldiDataDirError, read_kaldi_data_dir
    try:
        return read_kaldi_data_dir(folder, require_utt2spk=False, allow_commands=allow_commands)
    except KaldiDataDirError as error:
        raise AdaptationDataError(f"{option}={folder!r}: {error}") from None


def _specs(folders: AdaptationFolders, dev_fraction: float, seed: int, allow_commands: bool = False):
    """RecordingSpecs, UtteranceSpecs (without phones) and Problems of every folder."""
    from asr.data.corpus.manifest_builder import RecordingSpec, UtteranceSpec
    from asr.data.corpus.preparation_report import Problem
    from asr.text.normalisation import normalise_transcript

    recordings, utterances, problems = [], [], []
    for option, split, folder in folders.named():
        kaldi = _read_folder(option, folder, allow_commands)
        prefix = "" if split == TRAIN else f"{split}-"
        recordings += [RecordingSpec(prefix + rid, source) for rid, source in kaldi.recordings.items()]
        problems += [Problem(kind, prefix + item, f"{option}: {message}") for kind, item, message in kaldi.problems]
        texts = [normalise_transcript(list(u.words)) for u in kaldi.utterances]
        held = (held_out_texts([t for t in texts if t], dev_fraction, seed)
                if split == TRAIN and folders.dev is None else set())
        utterances += [UtteranceSpec(prefix + u.id, DEV if text in held else split, prefix + u.recording_id,
                                     u.speaker, text, u.start, u.end) for u, text in zip(kaldi.utterances, texts)]
    return recordings, utterances, problems


def prepare_adaptation_data(folders: AdaptationFolders, out_dir: str | Path, *, dev_fraction: float = 0.1,
                            seed: int = 0, phones: bool = True, skip_bad_audio: bool = False,
                            progress: bool = True, allow_commands: bool = False) -> dict:
    """Writes the manifests of corpus `adapt` (module doc) into out_dir; returns the preparation report.
    AdaptationDataError for a folder that is missing, not Kaldi-style, without usable utterances,
    or with bad audio (unless skip_bad_audio: then those utterances are left out and counted), or with a
    wav.scp pipe (a shell command) unless allow_commands (data.allow_commands)."""
    from asr.data.corpus.manifest_builder import (NoUtterancesError, PreparationError, UtteranceSpec, build_manifests,
                                                  file_identity)
    from asr.data.corpus.preparation_report import Problem, previous_complete_report

    out_dir = Path(out_dir).resolve()
    settings = {"folders": {option: {"path": str(Path(folder).resolve()),
                                     "files": {name: file_identity(Path(folder) / name)
                                               for name in ("wav.scp", "text", "utt2spk", "segments")
                                               if (Path(folder) / name).is_file()}}
                            for option, _, folder in folders.named()},
                "dev_fraction": None if folders.dev else dev_fraction, "dev_seed": None if folders.dev else seed,
                "phones": f"espeak-ng {ESPEAK_VOICE} {PHONE_SET}" if phones else None,
                "skip_bad_audio": skip_bad_audio}
    for option, _, folder in folders.named():
        _read_folder(option, folder, allow_commands)   # a missing or malformed folder stops us before anything is written
    done = previous_complete_report(out_dir, ADAPTATION_CORPUS, settings)
    if done is not None:
        return done
    recordings, utterances, problems = _specs(folders, dev_fraction, seed, allow_commands)
    left_out = []
    if phones:
        spoken = [u for u in utterances if u.text]
        said = dict(zip((u.id for u in spoken), sentence_phones([u.text for u in spoken], progress)))
        left_out = [Problem(UNMAPPABLE_PHONEME, uid, f"{uid}: {result}") for uid, result in said.items()
                    if isinstance(result, Exception)]
        utterances = [u if u.id not in said else UtteranceSpec(u.id, u.split, u.recording_id, u.speaker, u.text,
                                                                u.start, u.end, phones=said[u.id])
                      for u in utterances if not isinstance(said.get(u.id), Exception)]
    try:
        report = build_manifests(ADAPTATION_CORPUS, out_dir, recordings, utterances, problems, settings=settings,
                                 left_out=left_out, bad_data_policy="drop" if skip_bad_audio else "error",
                                 phone_set=PHONE_SET if phones else None, progress=progress)
    except PreparationError as error:
        message = str(error).replace("pass --bad-data drop", "give data.skip_bad_audio=true")
        raise AdaptationDataError(f"adapt.data_dir={folders.train!r}: {message}") from None
    except NoUtterancesError:
        raise AdaptationDataError(f"adapt.data_dir={folders.train!r}: its wav.scp and text hold no "
                                  "utterances") from None
    missing = [split for split in (TRAIN, DEV) + ((TEST,) if folders.test else ()) if split not in report["splits"]]
    if missing:
        raise AdaptationDataError(f"adapt.data_dir={folders.train!r}: no usable utterances left for split(s) "
                                  f"{missing} (the report: {out_dir / f'{ADAPTATION_CORPUS}_report.json'})")
    return report


def summary_line(report: dict) -> str:
    """'adaptation data: train 134 utterances (7.6 min), dev 15 (0.8 min); left out 2 (...)'."""
    splits = ", ".join(f"{split} {row['utterances']} utterances ({row['hours'] * 60:.1f} min)"
                       for split, row in report["splits"].items())
    dropped = report.get("dropped_utterances") or 0
    return f"adaptation data in {report['out_dir']}: {splits}" + (
        f"; left out {dropped} (listed in {ADAPTATION_CORPUS}_report.json)" if dropped else "")


def _read_cuts(path: Path):
    """The cuts of a .jsonl.gz manifest, one dict at a time."""
    with gzip.open(path, "rt") as handle:
        for line in handle:
            if line.strip():
                yield json.loads(line)


def _rehearsal_cut(cut: dict, folder: Path, phones: bool, manifest: Path) -> dict:
    """A cut of the trained model's training data as a cut of the rehearsal split: ids prefixed,
    relative audio paths made absolute (they are relative to the manifest's folder)."""
    supervisions = cut.get("supervisions") or []
    if not supervisions or not supervisions[0].get("text") or (
            phones and not (supervisions[0].get("custom") or {}).get("phones")):
        raise AdaptationDataError(f"adapt.rehearsal_cuts={str(manifest)!r}: cut {cut.get('id')!r} has no "
                                  f"{'phones' if phones else 'transcript'}; give the training manifest of the "
                                  "trained model (its cuts carry the targets it was trained on)")
    make_sources_absolute(cut, folder)
    recording = cut.get("recording") or {}
    cut["id"] = REHEARSAL_PREFIX + cut["id"]
    if "id" in recording:
        recording["id"] = REHEARSAL_PREFIX + recording["id"]
    for supervision in supervisions:
        supervision["id"] = REHEARSAL_PREFIX + supervision["id"]
        supervision["recording_id"] = recording.get("id", supervision.get("recording_id"))
    return cut


def write_rehearsal_split(out_dir: str | Path, rehearsal_cuts: str | Path, share: float, seed: int = 0,
                          phones: bool = True) -> dict:
    """Writes <out_dir>/adapt_cuts_train_rehearsal.jsonl.gz (module doc, "Rehearsal"): the train split's
    cuts, then the cuts of `rehearsal_cuts` with the lowest sha1(seed, id) whose durations first add
    up to `share` times the train split's. Returns what it took: utterances and seconds of each."""
    out_dir, manifest = Path(out_dir), Path(rehearsal_cuts).resolve()
    own = list(_read_cuts(cuts_path(out_dir, ADAPTATION_CORPUS, TRAIN)))
    own_seconds = sum(cut["duration"] for cut in own)
    wanted = share * own_seconds
    # the cuts of lowest key that cover `wanted`: a max-heap on the key, the highest dropped while the
    # others still cover it (memory: the sample, not the manifest)
    kept, total = [], 0.0
    for cut in _read_cuts(manifest):
        key = int(hashlib.sha1(f"{seed}:{cut['id']}".encode()).hexdigest(), 16)
        heapq.heappush(kept, (-key, cut["id"], cut))
        total += cut["duration"]
        while kept and total - kept[0][2]["duration"] >= wanted:
            total -= heapq.heappop(kept)[2]["duration"]
    if not kept:
        raise AdaptationDataError(f"adapt.rehearsal_cuts={str(manifest)!r} holds no utterances")
    sample = [_rehearsal_cut(cut, manifest.parent, phones, manifest)
              for _, _, cut in sorted(kept, key=lambda item: item[1])]
    target = cuts_path(out_dir, ADAPTATION_CORPUS, REHEARSAL_SPLIT)
    partial = target.with_name(target.name + ".partial")
    with gzip.open(partial, "wt") as handle:
        for cut in own + sample:
            handle.write(json.dumps(cut) + "\n")
    os.replace(partial, target)
    return {"source": str(manifest), "own_utterances": len(own), "own_seconds": own_seconds, "wanted_seconds": wanted,
            "rehearsal_utterances": len(sample), "rehearsal_seconds": sum(cut["duration"] for cut in sample)}


def rehearsal_line(taken: dict) -> str:
    short = taken["rehearsal_seconds"] < taken["wanted_seconds"]
    return (f"rehearsal: {taken['rehearsal_utterances']} utterances ({taken['rehearsal_seconds'] / 60:.1f} min"
            f"{', all it has: less than adapt.rehearsal asks' if short else ''}) of {taken['source']} beside your "
            f"{taken['own_utterances']} ({taken['own_seconds'] / 60:.1f} min)")

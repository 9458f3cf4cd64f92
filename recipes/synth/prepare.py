"""Generate the synthetic speech corpus and write its lhotse manifests.

    python -m recipes.synth.prepare --out data/synth --train 3000 --dev 200 --test 200 --seed 0 --jobs 2

Read top to bottom: the sentence pools of the splits, the plan of each utterance (its sentences,
speaker and voicing), synthesis in parallel, the manifests and the report.

- Sentences: the shipped WordNet list is shuffled with the seed and cut 90/5/5 % into train, dev
  and test pools, so no sentence is in two splits. An utterance joins 2-4 consecutive sentences
  of its split's pool until it reaches a drawn target of 14-30 words (about 5-10 s of speech);
  ``--utterance-scale K`` multiplies both ranges (K=2: 4-8 sentences, 28-60 words, about 16 s).
  A split that asks for more sentences than its pool holds goes round the pool again in a new
  order (sentences repeat within that split, never across splits).
- Speakers: train and dev use the 32 seen speakers (a quarter of the utterances flite, three
  quarters espeak-ng); half of the test utterances use the held-out speakers, the other half
  the seen ones. See ``recipes.synth.voices``.
- Extra voices (``--extra-voices festival``; off by default): a third of the seen espeak-ng
  utterances get one of festival's 3 US English voices instead, so festival speaks a quarter of
  the seen-speaker utterances (espeak-ng a half, flite a quarter) in every split; all festival
  voices are seen ones. The choice and the festival voicing come from a random stream of their own
  (``default_rng((seed, split, i, 1))``), so every other part of a plan (sentences, gain, and the
  speaker of the other utterances) is the default plan's: the held-out half of the test split and
  three quarters of the rest are the same utterances as without the option, and with the option off
  the corpus is the default one, byte for byte.
- Determinism: utterance i of a split draws everything from ``numpy.random.default_rng((seed,
  split, i))`` and the pool order; workers only run the synthesisers, so the output is identical
  for any number of jobs. Utterance ids are ``synth-{split}-{i:06d}``.
- Dropped utterances: when a synthesiser uses a phoneme with no ARPAbet equivalent (a foreign
  sound), or a festival diphone voice lacks a diphone (it would say silence in its place), the
  utterance is dropped, counted in the report with its reason, and the next planned utterance of
  the split takes its place, so each split still reaches its requested size.
- Resumable: each finished utterance leaves ``audio/{split}/{id}.flac`` and ``meta/{split}/{id}.json``
  (written last, atomically); a rerun skips utterances whose meta file exists. A complete output
  (``synth_report.json`` with the same request, manifests present) is returned as it is.
  The seed, the sentence list and the extra voices are recorded in ``synth_config.json``; reusing
  the folder with another seed or voice set is refused. Changing only the sizes reuses what is
  there (the plan of utterance i does not depend on the sizes).

Output in ``out_dir``: ``synth_{recordings,supervisions,cuts}_{train,dev,test}.jsonl.gz`` (audio
paths relative to ``out_dir``, which ``asr.data.manifests`` resolves), ``audio/``, ``meta/``,
``synth_report.json``, and for lexicon decoding ``lexicon.txt`` (every corpus word) and
``lm/3gram.arpa.gz`` (trained on the training transcripts only), see ``recipes.synth.lexicon_lm``.
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import json
import multiprocessing
import os
import sys
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from asr.core.exit_status import run_command
from recipes.synth.lexicon_lm import write_lexicon_and_lm
from asr.data.manifests import manifest_path
from asr.text.synthesiser_phonemes import UnmappablePhonemeError
from recipes.synth.sentences import load_sentences, normalise_text
from recipes.synth.voices import (
    ESPEAK_PITCH, ESPEAK_RATE_WPM, EXTRA_VOICES, FESTIVAL_DURATION_FACTOR, FESTIVAL_F0_FACTOR, FESTIVAL_SPEAKERS,
    FESTIVAL_VOICES, FLITE_DURATION_STRETCH, FLITE_F0_FACTOR, FLITE_VOICES, GAIN_DB, HELD_OUT_SPEAKER_IDS,
    SAMPLING_RATE, SPEAKERS, SPEAKERS_BY_ID, MissingDiphoneError, check_synthesisers, synthesise,
)

CORPUS = "synth"
SPLITS = ("train", "dev", "test")
SPLIT_CODES = {"train": 0, "dev": 1, "test": 2}  # part of the per-utterance seed
POOL_FRACTIONS = {"train": 0.90, "dev": 0.05, "test": 0.05}
WORDS_PER_UTTERANCE = (14, 30)  # target drawn uniformly (inclusive), times the utterance scale
SENTENCES_PER_UTTERANCE = (2, 4)  # times the utterance scale
FLITE_SHARE = 0.25  # of the utterances spoken by seen speakers
FESTIVAL_SHARE = 0.25  # of the seen speakers' utterances, with --extra-voices festival (taken from espeak-ng's)
FESTIVAL_STREAM = 1  # the last entry of the seed of the festival draws: (seed, split, i, FESTIVAL_STREAM)
HELD_OUT_SHARE_OF_TEST = 0.5
# Version of the planning rules: a folder made under other rules is not mixed with new utterances.
GENERATOR_VERSION = 1
CONFIG_FILE = "synth_config.json"
REPORT_FILE = "synth_report.json"


# ----------------------------------------------------------------------------- sentences per split

def split_sentence_pools(sentences: list[str], seed: int) -> dict[str, list[str]]:
    """Disjoint train/dev/test sentence pools: the list shuffled by ``seed``, cut by POOL_FRACTIONS."""
    order = np.random.default_rng((seed, 99)).permutation(len(sentences))
    shuffled = [sentences[i] for i in order]
    n_dev = max(1, round(POOL_FRACTIONS["dev"] * len(shuffled)))
    n_test = max(1, round(POOL_FRACTIONS["test"] * len(shuffled)))
    return {"dev": shuffled[:n_dev], "test": shuffled[n_dev:n_dev + n_test], "train": shuffled[n_dev + n_test:]}


# ----------------------------------------------------------------------------- utterance plans

@dataclass(frozen=True)
class UtterancePlan:
    id: str
    split: str
    index: int
    sentences: tuple[str, ...]
    speaker: str
    prosody: dict = field(hash=False)
    gain_db: float = 0.0

    @property
    def text(self) -> str:
        """What the synthesiser reads: the sentences, each ending in a full stop."""
        return " ".join(self.sentences)


def parse_extra_voices(extra_voices: str | list[str] | tuple[str, ...] | None) -> tuple[str, ...]:
    """The extra voice sets asked for ("festival", or a comma-separated list; None or "" for none),
    sorted; an unknown one is a ValueError naming the choices."""
    if extra_voices is None:
        return ()
    names = extra_voices.split(",") if isinstance(extra_voices, str) else list(extra_voices)
    names = sorted({str(name).strip() for name in names} - {""})
    unknown = [name for name in names if name not in EXTRA_VOICES]
    if unknown:
        raise ValueError(f"unknown extra voices {', '.join(map(repr, unknown))} (--extra-voices, or "
                         f"synth_corpus.extra_voices in asr.train); the choices are: {', '.join(EXTRA_VOICES)}")
    return tuple(names)


def speaker_ids(held_out: bool) -> list[str]:
    """The held-out speakers (test only), or the seen ones (all splits)."""
    if held_out:
        return list(HELD_OUT_SPEAKER_IDS)
    return [s.id for s in SPEAKERS if s.id not in HELD_OUT_SPEAKER_IDS]


class SplitPlanner:
    """The endless, deterministic sequence of utterance plans of one split."""

    def __init__(self, split: str, pool: list[str], seed: int, utterance_scale: int = 1,
                 extra_voices: tuple[str, ...] = ()):
        if not pool:
            raise ValueError(f"the sentence pool of split {split!r} is empty")
        self.split, self.pool, self.seed, self.extra_voices = split, pool, seed, extra_voices
        self.words_range = tuple(utterance_scale * n for n in WORDS_PER_UTTERANCE)
        self.sentences_range = tuple(utterance_scale * n for n in SENTENCES_PER_UTTERANCE)
        self._epoch, self._position, self._order = -1, len(pool), np.arange(0)
        self._next_index = 0

    def _next_sentence(self) -> str:
        if self._position >= len(self.pool):  # new round through the pool, in a new order
            self._epoch += 1
            self._order = np.random.default_rng((self.seed, SPLIT_CODES[self.split], 10**6 + self._epoch)) \
                .permutation(len(self.pool))
            self._position = 0
        sentence = self.pool[self._order[self._position]]
        self._position += 1
        return sentence

    def next_plan(self) -> UtterancePlan:
        index = self._next_index
        self._next_index += 1
        rng = np.random.default_rng((self.seed, SPLIT_CODES[self.split], index))

        held_out = self.split == "test" and rng.random() < HELD_OUT_SHARE_OF_TEST
        candidates = speaker_ids(held_out)
        if not held_out:  # choose the engine first, so flite's 4 voices are not swamped by espeak's 28
            engine = "flite" if rng.random() < FLITE_SHARE else "espeak-ng"
            candidates = [s for s in candidates if SPEAKERS_BY_ID[s].engine == engine]
        speaker = SPEAKERS_BY_ID[candidates[rng.integers(len(candidates))]]

        if speaker.engine == "espeak-ng":
            prosody = {"rate_wpm": int(rng.integers(ESPEAK_RATE_WPM[0], ESPEAK_RATE_WPM[1] + 1)),
                       "pitch": int(rng.integers(ESPEAK_PITCH[0], ESPEAK_PITCH[1] + 1))}
        else:
            prosody = {"duration_stretch": round(float(rng.uniform(*FLITE_DURATION_STRETCH)), 3),
                       "f0_mean_hz": round(FLITE_VOICES[speaker.voice] * float(rng.uniform(*FLITE_F0_FACTOR)), 1)}
        gain_db = round(float(rng.uniform(*GAIN_DB)), 2)

        target_words = int(rng.integers(self.words_range[0], self.words_range[1] + 1))
        sentences, words = [], 0
        while len(sentences) < self.sentences_range[0] or (
                words < target_words and len(sentences) < self.sentences_range[1]):
            sentence = self._next_sentence()
            sentences.append(sentence)
            words += len(normalise_text(sentence).split())
        plan = UtterancePlan(id=f"{CORPUS}-{self.split}-{index:06d}", split=self.split, index=index,
                             sentences=tuple(sentences), speaker=speaker.id, prosody=prosody, gain_db=gain_db)
        if "festival" in self.extra_voices and speaker.engine == "espeak-ng" and not held_out:
            plan = self._festival_instead(plan)
        return plan

    def _festival_instead(self, plan: UtterancePlan) -> UtterancePlan:
        """The plan with a festival voice for FESTIVAL_SHARE of the seen speakers' utterances (a
        share of the espeak-ng ones), drawn from a stream of its own: the rest of the plan stays."""
        rng = np.random.default_rng((self.seed, SPLIT_CODES[self.split], plan.index, FESTIVAL_STREAM))
        if rng.random() >= FESTIVAL_SHARE / (1 - FLITE_SHARE):
            return plan
        speaker = FESTIVAL_SPEAKERS[rng.integers(len(FESTIVAL_SPEAKERS))]
        voice = FESTIVAL_VOICES[speaker.voice]
        duration_factor = float(rng.uniform(*FESTIVAL_DURATION_FACTOR))
        f0_factor = float(rng.uniform(*FESTIVAL_F0_FACTOR))  # drawn for every voice, used where it has an F0 model
        prosody = {"duration_stretch": round(voice.duration_stretch * duration_factor, 3)}
        if voice.f0_mean_hz is not None:
            prosody["f0_mean_hz"] = round(voice.f0_mean_hz * f0_factor, 1)
        return dataclasses.replace(plan, speaker=speaker.id, prosody=prosody)


def plan_utterances(sentences: list[str], seed: int, counts: dict[str, int], utterance_scale: int = 1,
                    extra_voices: tuple[str, ...] = ()) -> dict[str, list[UtterancePlan]]:
    """The first ``counts[split]`` plans of each split (no synthesis; drops are not known yet)."""
    pools = split_sentence_pools(sentences, seed)
    plans = {}
    for split in SPLITS:
        planner = SplitPlanner(split, pools[split], seed, utterance_scale, extra_voices)
        plans[split] = [planner.next_plan() for _ in range(counts.get(split, 0))]
    return plans


# ----------------------------------------------------------------------------- synthesis (workers)

def _meta_path(out_dir: Path, plan: UtterancePlan) -> Path:
    return out_dir / "meta" / plan.split / f"{plan.id}.json"


def _audio_relpath(plan: UtterancePlan) -> str:
    return f"audio/{plan.split}/{plan.id}.flac"


def synthesise_plan(out_dir: Path, plan: UtterancePlan) -> dict:
    """Synthesise one planned utterance; write its audio and meta record; return the record.

    The record is the plan plus either (text, phones, audio, num_samples, duration) or
    (dropped: reason, phoneme). The meta file is written last and atomically: it marks the
    utterance done for a resumed run.
    """
    out_dir = Path(out_dir)
    record = {"id": plan.id, "split": plan.split, "index": plan.index, "speaker": plan.speaker,
              "engine": SPEAKERS_BY_ID[plan.speaker].engine, "voice": SPEAKERS_BY_ID[plan.speaker].voice,
              "prosody": plan.prosody, "gain_db": plan.gain_db, "sentences": list(plan.sentences),
              "text": normalise_text(plan.text)}
    final_audio = out_dir / _audio_relpath(plan)
    final_audio.parent.mkdir(parents=True, exist_ok=True)
    partial_audio = final_audio.with_name(f"{plan.id}.partial.flac")
    try:
        result = synthesise(plan.text, SPEAKERS_BY_ID[plan.speaker], plan.prosody, plan.gain_db, partial_audio)
    except UnmappablePhonemeError as error:
        partial_audio.unlink(missing_ok=True)
        record.update(dropped=f"unmappable {error.engine} phoneme", phoneme=error.phoneme)
    except MissingDiphoneError as error:
        partial_audio.unlink(missing_ok=True)
        record.update(dropped="missing festival diphone", phoneme=error.diphone)
    else:
        os.replace(partial_audio, final_audio)
        record.update(phones=" ".join(result.phones), audio=_audio_relpath(plan), num_samples=result.num_samples,
                      sampling_rate=SAMPLING_RATE, duration=result.num_samples / SAMPLING_RATE)
    meta = _meta_path(out_dir, plan)
    meta.parent.mkdir(parents=True, exist_ok=True)
    partial_meta = meta.with_suffix(".partial")
    partial_meta.write_text(json.dumps(record, sort_keys=True))
    os.replace(partial_meta, meta)
    return record


def _synthesise_task(task: tuple[str, UtterancePlan]) -> dict:
    return synthesise_plan(Path(task[0]), task[1])


def _load_done(out_dir: Path, plan: UtterancePlan) -> dict | None:
    meta = _meta_path(out_dir, plan)
    if not meta.is_file():
        return None
    record = json.loads(meta.read_text())
    if "dropped" not in record and not (out_dir / record["audio"]).is_file():
        return None  # audio deleted by hand: make it again
    if record["sentences"] != list(plan.sentences) or record["speaker"] != plan.speaker:
        raise RuntimeError(f"{meta} does not match the current plan of {plan.id}; the folder was made "
                           f"by another version of the generator: delete {out_dir} and generate again")
    return record


# ----------------------------------------------------------------------------- the whole corpus

def _check_config(out_dir: Path, seed: int, sentences: list[str], utterance_scale: int,
                  extra_voices: tuple[str, ...] = ()) -> None:
    """Record (or compare with) what fixes the plans: seed, sentence list, generator version, and the
    utterance scale where it is not 1 and the extra voices where there are some (folders made before
    these options existed stay valid)."""
    config = {"corpus": CORPUS, "seed": seed, "generator_version": GENERATOR_VERSION,
              "sentences_sha256": hashlib.sha256("\n".join(sentences).encode()).hexdigest()}
    if utterance_scale != 1:
        config["utterance_scale"] = utterance_scale
    if extra_voices:
        config["extra_voices"] = list(extra_voices)
    path = out_dir / CONFIG_FILE
    if path.is_file():
        existing = json.loads(path.read_text())
        if existing != config:
            differ = ", ".join(f"{k}: {existing.get(k)!r} there, {config.get(k)!r} now"
                               for k in sorted(existing.keys() | config.keys()) if existing.get(k) != config.get(k))
            raise ValueError(f"{out_dir} holds a synthetic corpus made with other settings ({differ}); "
                             f"use another folder (--out; data.root in asr.train) or delete {out_dir}")
    else:
        path.write_text(json.dumps(config, indent=1, sort_keys=True))


def _is_complete(out_dir: Path, request: dict) -> dict | None:
    path = out_dir / REPORT_FILE
    if not path.is_file():
        return None
    report = json.loads(path.read_text())
    manifests = [manifest_path(out_dir, CORPUS, kind, split)
                 for split in SPLITS for kind in ("recordings", "supervisions", "cuts")]
    if report.get("request") != request or not all(p.is_file() for p in manifests):
        return None
    return report


def generate_corpus(out_dir: str | os.PathLike, counts: dict[str, int], seed: int = 0, jobs: int | None = None,
                    progress: bool = True, sentences: list[str] | None = None, utterance_scale: int = 1,
                    extra_voices: str | list[str] | tuple[str, ...] | None = None) -> dict:
    """``prepare_synth`` with any sentence list (tests use a tiny one); returns the report."""
    out_dir = Path(out_dir).resolve()
    extra_voices = parse_extra_voices(extra_voices)
    if not isinstance(utterance_scale, (int, np.integer)) or not 1 <= utterance_scale <= 4:
        raise ValueError(f"the utterance scale must be an integer from 1 to 4, got {utterance_scale!r}")
    for split, count in counts.items():
        if split not in SPLITS:
            raise ValueError(f"unknown split {split!r}; the splits are {', '.join(SPLITS)}")
        if not isinstance(count, (int, np.integer)) or count < 0:
            raise ValueError(f"the number of {split} utterances must be an integer >= 0, got {count!r}")
    counts = {split: int(counts.get(split, 0)) for split in SPLITS}
    jobs = jobs or os.cpu_count() or 1
    if jobs < 1:
        raise ValueError(f"jobs must be >= 1, got {jobs}")
    sentences = load_sentences() if sentences is None else list(sentences)
    request = {"counts": counts, "seed": seed}
    if utterance_scale != 1:
        request["utterance_scale"] = int(utterance_scale)
    if extra_voices:
        request["extra_voices"] = list(extra_voices)

    out_dir.mkdir(parents=True, exist_ok=True)
    report = _is_complete(out_dir, request)
    if report is not None:
        _check_config(out_dir, seed, sentences, utterance_scale, extra_voices)
        write_lexicon_and_lm(out_dir, CORPUS, SPLITS)     # a folder made before they existed gains them
        return report
    check_synthesisers(extra_voices)
    _check_config(out_dir, seed, sentences, utterance_scale, extra_voices)

    started = time.time()
    pools = split_sentence_pools(sentences, seed)
    kept: dict[str, list[dict]] = {}
    dropped: dict[str, list[dict]] = {}
    with _WorkerPool(jobs) as pool:
        for split in SPLITS:
            planner = SplitPlanner(split, pools[split], seed, utterance_scale, extra_voices)
            kept[split], dropped[split] = _generate_split(out_dir, planner,
                                                          counts[split], pool, progress)
    _write_manifests(out_dir, kept)
    write_lexicon_and_lm(out_dir, CORPUS, SPLITS)
    speakers = [s.id for s in SPEAKERS] + [s.id for name in extra_voices for s in EXTRA_VOICES[name]]
    report = _make_report(request, kept, dropped, pools, speakers, jobs, time.time() - started)
    (out_dir / REPORT_FILE).write_text(json.dumps(report, indent=1, sort_keys=True))
    return report


class _WorkerPool:
    """A process pool (spawned, so it is safe inside a multithreaded trainer), or none for jobs=1."""

    def __init__(self, jobs: int):
        self.jobs, self.pool = jobs, None

    def __enter__(self):
        if self.jobs > 1:
            self.pool = multiprocessing.get_context("spawn").Pool(self.jobs)
        return self

    def __exit__(self, *exc):
        if self.pool is not None:
            self.pool.terminate()
            self.pool.join()

    def imap(self, tasks):
        if self.pool is None:
            return map(_synthesise_task, tasks)
        return self.pool.imap(_synthesise_task, tasks, chunksize=2)


def _generate_split(out_dir: Path, planner: SplitPlanner, count: int, pool: _WorkerPool,
                    progress: bool) -> tuple[list[dict], list[dict]]:
    """Synthesise plans in order until ``count`` are kept; dropped ones are replaced by the next plans."""
    from tqdm import tqdm

    kept, dropped = [], []
    bar = tqdm(total=count, desc=f"synth {planner.split}", unit="utt", disable=not progress)
    while len(kept) < count:
        plans = [planner.next_plan() for _ in range(count - len(kept))]
        records = {}
        pending = []
        for plan in plans:
            record = _load_done(out_dir, plan)
            if record is None:
                pending.append(plan)
            else:
                records[plan.id] = record
        bar.update(sum("dropped" not in r for r in records.values()))
        for record in pool.imap([(str(out_dir), plan) for plan in pending]):
            records[record["id"]] = record
            bar.update("dropped" not in record)
        for plan in plans:  # plan order, not completion order
            (dropped if "dropped" in records[plan.id] else kept).append(records[plan.id])
        if len(dropped) > max(50, count):
            raise RuntimeError(f"{len(dropped)} {planner.split} utterances dropped for "
                               f"{Counter(d['phoneme'] for d in dropped).most_common(5)}: the phoneme "
                               f"mapping (asr/text/synthesiser_phonemes.py) does not fit this synthesiser version")
    bar.close()
    return kept, dropped


def _write_manifests(out_dir: Path, kept: dict[str, list[dict]]) -> None:
    from lhotse import AudioSource, CutSet, MonoCut, Recording, RecordingSet, SupervisionSegment, SupervisionSet

    for split, records in kept.items():
        recordings = RecordingSet.from_recordings(
            Recording(id=r["id"], sources=[AudioSource(type="file", channels=[0], source=r["audio"])],
                      sampling_rate=r["sampling_rate"], num_samples=r["num_samples"], duration=r["duration"])
            for r in records)
        supervisions = SupervisionSet.from_segments(
            SupervisionSegment(id=r["id"], recording_id=r["id"], start=0.0, duration=r["duration"], channel=0,
                               text=r["text"], speaker=r["speaker"], language="English",
                               custom={"phones": r["phones"]})
            for r in records)
        # One MonoCut per utterance, with the utterance id (from_manifests would append "-0").
        cuts = CutSet.from_cuts(
            MonoCut(id=recording.id, start=0.0, duration=recording.duration, channel=0, recording=recording,
                    supervisions=[supervisions[recording.id]])
            for recording in recordings)
        # Written to a temporary name first: a manifest that exists is always whole.
        for kind, manifest in (("recordings", recordings), ("supervisions", supervisions), ("cuts", cuts)):
            path = manifest_path(out_dir, CORPUS, kind, split)
            partial = path.with_name(path.name.replace(".jsonl.gz", ".partial.jsonl.gz"))
            manifest.to_file(partial)
            os.replace(partial, path)


def _make_report(request, kept, dropped, pools, speakers, jobs, seconds) -> dict:
    splits = {}
    for split in SPLITS:
        durations = np.array([r["duration"] for r in kept[split]]) if kept[split] else np.zeros(0)
        splits[split] = {
            "utterances": len(kept[split]),
            "hours": round(float(durations.sum()) / 3600, 3),
            "duration_s": ({"mean": round(float(durations.mean()), 2), "min": round(float(durations.min()), 2),
                            "max": round(float(durations.max()), 2)} if len(durations) else None),
            "speakers": len({r["speaker"] for r in kept[split]}),
            "held_out_speaker_utterances": sum(r["speaker"] in HELD_OUT_SPEAKER_IDS for r in kept[split]),
            "engines": dict(Counter(r["engine"] for r in kept[split])),
            "sentence_pool": len(pools[split]),
            "dropped": len(dropped[split]),
            "dropped_by_reason": dict(Counter(f"{d['dropped']} {d['phoneme']!r}" for d in dropped[split])),
            "dropped_ids": [d["id"] for d in dropped[split]],
        }
    return {"corpus": CORPUS, "request": request, "splits": splits,
            "held_out_speakers": list(HELD_OUT_SPEAKER_IDS), "speakers": speakers,
            "generation": {"jobs": jobs, "seconds": round(seconds, 1)}}


def prepare_synth(out_dir, train_utterances: int = 3000, dev_utterances: int = 200, test_utterances: int = 200,
                  seed: int = 0, jobs: int | None = None, progress: bool = True, utterance_scale: int = 1,
                  extra_voices: str | list[str] | tuple[str, ...] | None = None) -> dict:
    """Generate (or finish, or reuse) the synthetic corpus in ``out_dir``; return the report.

    ``utterance_scale`` K makes utterances K times longer (K x 14-30 words, K x 2-4 sentences: about
    16 s for K=2); the paper-length experiment uses 2. ``extra_voices="festival"`` gives festival's
    US English voices a quarter of the seen speakers' utterances (None: the default voices only).
    Both are part of the folder's config.

    The report (also ``out_dir/synth_report.json``) holds per split the number of utterances,
    hours, duration range, speakers, and the dropped utterances by reason.
    Raises ``MissingSynthesiserError`` naming the Debian packages when espeak-ng, flite or sox is missing
    (or festival or one of its voices, when they are asked for).
    """
    return generate_corpus(out_dir, {"train": train_utterances, "dev": dev_utterances, "test": test_utterances},
                           seed=seed, jobs=jobs, progress=progress, utterance_scale=utterance_scale,
                           extra_voices=extra_voices)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Generate the synthetic speech corpus (espeak-ng + flite, "
                                                 "optionally festival) and its lhotse manifests.")
    parser.add_argument("--out", default="data/synth", help="output folder (default data/synth)")
    parser.add_argument("--train", type=int, default=3000, help="training utterances (default 3000)")
    parser.add_argument("--dev", type=int, default=200, help="dev utterances (default 200)")
    parser.add_argument("--test", type=int, default=200, help="test utterances (default 200)")
    parser.add_argument("--seed", type=int, default=0, help="seed of sentences, speakers and voicing (default 0)")
    parser.add_argument("--jobs", type=int, default=None, help="parallel processes (default: all CPUs)")
    parser.add_argument("--utterance-scale", type=int, default=1, metavar="K",
                        help="K times longer utterances: K x 14-30 words, about K x 8 s (default 1; 1 to 4)")
    parser.add_argument("--extra-voices", default=None, metavar="SET",
                        help="festival: festival's 3 US English voices speak a quarter of the seen speakers' "
                             "utterances (default: espeak-ng and flite only; needs the festival packages)")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")
    args = parser.parse_args(argv)
    from recipes.synth.voices import MissingSynthesiserError

    def generate_and_print() -> None:
        try:
            Path(args.out).mkdir(parents=True, exist_ok=True)
        except OSError as error:
            raise ValueError(f"--out {args.out}: cannot create the folder ({error.strerror or error})") from None
        report = prepare_synth(args.out, args.train, args.dev, args.test, seed=args.seed, jobs=args.jobs,
                               progress=not args.no_progress, utterance_scale=args.utterance_scale,
                               extra_voices=args.extra_voices)
        for split in SPLITS:
            numbers = report["splits"][split]
            mean = numbers["duration_s"]["mean"] if numbers["duration_s"] else 0
            print(f"{split:5s}: {numbers['utterances']} utterances, {numbers['hours']} h (mean {mean} s), "
                  f"{numbers['speakers']} speakers, {numbers['dropped']} dropped")
        print(f"manifests and report in {Path(args.out).resolve()} ({report['generation']['seconds']} s)")

    # ValueError: a count, seed or --out the generator cannot use; a missing synthesiser is the machine's
    return run_command("recipes.synth.prepare", generate_and_print, usage_errors=(ValueError,),
                       failures=(MissingSynthesiserError,),
                       resume_hint="run the same command again: it keeps the utterances generated so far")


if __name__ == "__main__":
    sys.exit(main())

"""Synthesising planned utterances (``recipes.synth.plans``), in worker processes and resumably:
each finished utterance leaves ``audio/{split}/{id}.flac`` and ``meta/{split}/{id}.json``.

- Progress: one bar per split, in utterances. Slow engines (festival's HTS voice, piper: about 10
  times espeak-ng's time per utterance) are spread evenly over the plans by their random draws,
  so the rate and the time left hold from the start; utterances a resumed run finds done start
  the bar (tqdm's ``initial``) rather than count as speed.
- Dropped utterances: when a synthesiser uses a phoneme with no ARPAbet equivalent (a foreign
  sound), or a festival diphone voice lacks a diphone (it would say silence in its place), the
  utterance is dropped, counted in the report with its reason, and the next planned utterance of
  the split takes its place, so each split still reaches its requested size.
"""

from __future__ import annotations

import json
import multiprocessing
import os
import uuid
from collections import Counter
from pathlib import Path

from asr.text.synthesiser_phonemes import UnmappablePhonemeError
from recipes.synth.plans import SplitPlanner, UtterancePlan
from recipes.synth.sentences import normalise_text
from recipes.synth.voices import SAMPLING_RATE, SPEAKERS_BY_ID, MissingDiphoneError, synthesise


PARTIAL = ".partial"   # in the names of files being written: `<name>.partial-<pid>-<random><suffix>`


def partial_suffix() -> str:
    """A temporary name's mark, this process's own: two writers never write one file."""
    return f"{PARTIAL}-{os.getpid()}-{uuid.uuid4().hex[:8]}"


def remove_partial_files(out_dir: Path) -> None:
    """Deletes what writes killed before their rename left (the caller holds the folder's lock, so no
    other process is writing)."""
    for pattern in (f"audio/*/*{PARTIAL}*", f"meta/*/*{PARTIAL}*", f"*{PARTIAL}*", f"lm/*{PARTIAL}*"):
        for path in Path(out_dir).glob(pattern):
            path.unlink(missing_ok=True)


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
    partial_audio = final_audio.with_name(f"{plan.id}{partial_suffix()}.flac")
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
    partial_meta = meta.with_name(f"{plan.id}{partial_suffix()}")
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


class WorkerPool:
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


def generate_split(out_dir: Path, planner: SplitPlanner, count: int, pool: WorkerPool,
                    progress: bool) -> tuple[list[dict], list[dict]]:
    """Synthesise plans in order until ``count`` are kept; dropped ones are replaced by the next plans."""
    from tqdm import tqdm

    kept, dropped = [], []
    bar = None
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
        resumed = sum("dropped" not in r for r in records.values())
        if bar is None:  # utterances a resumed run finds done are its start, not its speed: no false ETA
            bar = tqdm(total=count, initial=resumed, desc=f"synth {planner.split}", unit="utt", disable=not progress)
        else:
            bar.update(resumed)
        for record in pool.imap([(str(out_dir), plan) for plan in pending]):
            records[record["id"]] = record
            bar.update("dropped" not in record)
        for plan in plans:  # plan order, not completion order
            (dropped if "dropped" in records[plan.id] else kept).append(records[plan.id])
        if len(dropped) > max(50, count):
            raise RuntimeError(f"{len(dropped)} {planner.split} utterances dropped for "
                               f"{Counter(d['phoneme'] for d in dropped).most_common(5)}: the phoneme "
                               f"mapping (asr/text/synthesiser_phonemes.py) does not fit this synthesiser version")
    if bar is not None:
        bar.close()
    return kept, dropped

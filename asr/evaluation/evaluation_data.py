"""What an evaluation scores: a split of the model's corpus, of another corpus, or a Kaldi-style
data folder turned into manifests. An evaluation never generates or changes a corpus; only an
evaluation set (asterisk) is prepared on first use, into a folder of its own (`check_split`)."""
from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path

from asr.core.errors import EvaluationError, closest_name
from asr.data.config import DataConfig
from asr.data.corpus.corpus import Corpus
from asr.data.datamodule import SpeechDataModule
from asr.core.corpus_lock import LOCK_FILE, writing_corpus_folder
from asr.data.corpus.manifests import cuts_path, default_root, manifest_name, other_corpora
from asr.model.recognizer import SpeechRecognizer
from asr.model.run_folder import trained_data_config

log = logging.getLogger("asr.evaluate")
KALDI_CORPUS, KALDI_SPLIT = "kaldi", "eval"


def kaldi_manifests(data_dir: str | Path, out_dir: Path, progress: bool = True, skip_bad_audio: bool = False,
                    allow_commands: bool = False) -> Path:
    """Converts a Kaldi-style data directory into the manifests asr.data reads (split 'eval' of
    corpus 'kaldi') under out_dir; the audio is converted once and reused by later runs.
    Unreadable, empty, multi-channel audio stops it with the recipe's list of problems, or with
    data.skip_bad_audio=true is left out and counted (the recipes' --bad-data drop). A wav.scp pipe
    (a shell command) is refused unless `allow_commands` (data.allow_commands=true)."""
    from asr.data.corpus.kaldi_dir import KaldiDataDirError, read_kaldi_data_dir
    from asr.data.corpus.manifest_builder import (NoUtterancesError, PreparationError, RecordingSpec, UtteranceSpec,
                                                  build_manifests, file_identity, problem_policy_option)
    from asr.data.corpus.preparation_report import Problem
    from asr.text.normalisation import normalise_transcript
    try:
        kaldi = read_kaldi_data_dir(data_dir, require_utt2spk=False, allow_commands=allow_commands)
    except KaldiDataDirError as error:
        raise EvaluationError(f"data_dir: {error}") from None
    recordings = [RecordingSpec(rid, source) for rid, source in kaldi.recordings.items()]
    utterances = [UtteranceSpec(u.id, KALDI_SPLIT, u.recording_id, u.speaker,
                                normalise_transcript(list(u.words)), u.start, u.end)
                  for u in kaldi.utterances]
    problems = [Problem(kind, item, message) for kind, item, message in kaldi.problems]
    settings = {"data_dir": str(Path(data_dir).resolve()),
                "files": {name: file_identity(Path(data_dir) / name)
                          for name in ("wav.scp", "text", "utt2spk", "segments")
                          if (Path(data_dir) / name).is_file()}}
    try:
        report = build_manifests(KALDI_CORPUS, out_dir, recordings, utterances, problems, settings=settings,
                                 progress=progress, bad_data_policy="drop" if skip_bad_audio else "error")
    except PreparationError as error:
        # the recipe's advice names its own option; here the same choice is data.skip_bad_audio
        message = str(error).replace("pass --bad-data drop", "give data.skip_bad_audio=true")
        raise EvaluationError(f"data_dir={str(data_dir)!r}: {message}") from None
    except NoUtterancesError:
        raise EvaluationError(f"data_dir={str(data_dir)!r}: its wav.scp and text hold no utterances") from None
    if report.get("dropped_utterances"):   # each reason named: an empty transcript is left out whatever the options
        reasons = ", ".join(f"{count} {kind.replace('_', ' ')}" + (" (data.skip_bad_audio=true)" if
                                                                   problem_policy_option(kind) else "")
                            for kind, count in report.get("problem_counts", {}).items())
        log.warning("data_dir=%s: left out %d utterances (%s; the list is in %s)", data_dir,
                    report["dropped_utterances"], reasons, out_dir / f"{KALDI_CORPUS}_report.json")
    return out_dir


def splits_on_disk(corpus: Corpus, cache_folder: Path) -> list[str]:
    """The splits of `corpus` in its folder: those with a cuts manifest, and those whose streaming
    shards are prepared in the feature cache (a finished stream is read without its manifest)."""
    pattern = manifest_name(corpus.name, "cuts", "*")
    prefix, suffix = pattern.split("*")
    splits = {path.name[len(prefix):-len(suffix)] for path in corpus.root.glob(pattern)} if corpus.root.is_dir() else set()
    if cache_folder.is_dir():
        splits |= {folder.parent.name for folder in cache_folder.glob("*/*/stream") if folder.is_dir()}
    return sorted(splits)


def check_split(corpus: Corpus, split: str, cache_folder: Path, progress: bool = True) -> None:
    """Before any work: EvaluationError (a usage error) for a split the corpus does not have, naming the
    split, the folder and the splits it has. An evaluation never generates or changes a corpus, with
    one exception that cannot damage a folder: an evaluation set whose recipe declares
    `evaluation_splits` (asterisk, the real-speech set) is prepared on first use into a folder that
    does not exist yet or is empty, under the folder's lock. A folder holding no manifest of the
    corpus at all is an error naming the recipe command (or, where the folder holds the split under
    another corpus name, load_cuts' error naming data.corpus)."""
    from asr.data.corpus.corpus_recipes import corpus_recipe, preparation_hint
    root, name = corpus.root, corpus.name
    present = splits_on_disk(corpus, cache_folder)
    if split in present:
        return
    if present:
        raise EvaluationError(f"split={split!r}: corpus {name} in {root} has no such split; its splits are "
                              f"{', '.join(present)}")
    if other_corpora(root, name, split):
        return
    recipe = corpus_recipe(name)
    if recipe is None or not recipe.evaluation_splits:
        where = "does not exist" if not root.is_dir() else f"holds no {manifest_name(name, 'cuts', '<split>')}"
        generated = f" (asr.train generates {name} when it trains on it)" if recipe and recipe.preparer else ""
        raise EvaluationError(f"data.root={str(root)!r} {where}: an evaluation generates no corpus; its manifests: "
                              f"{preparation_hint(name, root)}{generated}, or give data.root=<its folder>")
    if split not in recipe.evaluation_splits:
        raise EvaluationError(f"split={split!r}: corpus {name} has no such split; its splits are "
                              f"{', '.join(recipe.evaluation_splits)} (not prepared yet in {root})")
    if root.is_dir() and any(entry.name != LOCK_FILE for entry in root.iterdir()):
        raise EvaluationError(f"data.corpus={name}: {root} holds no {name} manifests but other files; asr.evaluate "
                              f"prepares {name} only into a new or empty folder: give data.root=<another folder>, or "
                              f"{preparation_hint(name, root)}")
    with writing_corpus_folder(root, f"preparing corpus {name}"):
        if corpus.cuts_path(split).is_file():   # another process prepared it while this one waited
            return
        log.info("corpus %s: not in %s yet, preparing it there (once)", name, root)
        try:
            recipe.preparer(root, progress=progress)
        except (ValueError, RuntimeError, OSError) as error:   # a preparer's own errors: usage, problems, files
            raise EvaluationError(f"data.corpus={name}: preparing its manifests in {root} failed: "
                                  f"{error}") from error


# data.* keys that shape only the training split (asr.data.datamodule applies them to data.train_split)
TRAINING_ONLY = ("augment", "max_train_utterances", "join_seconds", "join_pause", "join_by")


@dataclass
class EvaluationData:
    """What to score: a data module with the model's tokenizers, the split, the heads with references."""
    datamodule: SpeechDataModule
    split: str
    scored: list[str]            # target kinds whose references the data has
    source: str                  # for the report: the manifest or the Kaldi directory


def _check_data_option_names(overrides: dict) -> None:
    """EvaluationError for a data.<key> override that names no data option (with the nearest one), or
    one that shapes only a training set."""
    unknown = sorted(set(overrides) - set(DataConfig.__dataclass_fields__))
    if unknown:
        meant = closest_name(unknown[0], DataConfig.__dataclass_fields__)
        raise EvaluationError(f"data.{unknown[0]} is not a data option; did you mean data.{meant}?" if meant else
                              f"data.{unknown[0]} is not a data option; they are: "
                              f"{', '.join(DataConfig.__dataclass_fields__)}")
    for key in TRAINING_ONLY:
        if key in overrides:
            raise EvaluationError(f"data.{key} shapes the training set only; an evaluation scores the utterances "
                                  "as they are: leave it out")


def _evaluation_data_config(settings: dict, overrides: dict) -> DataConfig:
    """The checked data config of an evaluation; an override of what the model fixes is refused."""
    for key in ("num_mel_bins", "specaugment", "targets"):
        if key in overrides and overrides[key] != settings[key]:
            raise EvaluationError(f"data.{key}={overrides[key]!r} cannot be changed for an evaluation: "
                                  f"the model sets it to {settings[key]!r}")
    try:
        config = DataConfig.of({key: value for key, value in settings.items()
                                if key in DataConfig.__dataclass_fields__})
    except (ValueError, TypeError) as error:
        raise EvaluationError(f"data: {error}") from None
    return config


def evaluation_data(model: SpeechRecognizer, checkpoint: str | Path, split: str | None = None,
                    data_dir: str | Path | None = None, data_overrides: dict | None = None,
                    progress: bool = True) -> EvaluationData:
    """The data to score `model` on: a split of its training corpus (or the corpus data.* names),
    or a Kaldi-style directory converted to manifests (and features) in data.root, by default
    <data_dir>/asr_manifests, where later evaluations find them again.

    What the command line gives wins over the run folder's stored config: data.<key> overrides,
    and `progress` (unless data.progress is given) over the stored data.progress. An override
    that would be ignored is an error: an unknown key, one the model fixes (its feature bins,
    its heads, no SpecAugment), or one that shapes only a training set (TRAINING_ONLY)."""
    overrides = dict(data_overrides or {})
    _check_data_option_names(overrides)
    # the model's training settings, less what shaped its training set (speed-perturbed copies, a cap on
    # the utterances): a split named as the training split, or a data_dir, is scored as it is
    trained = trained_data_config(checkpoint)
    settings = {key: value for key, value in trained.items() if key not in TRAINING_ONLY}
    # commands run only when this command line asks: a run folder's stored config (perhaps from
    # someone else) cannot switch them on
    settings["allow_commands"] = False
    settings.update(overrides)
    if not isinstance(settings["allow_commands"], bool):
        raise EvaluationError(f"data.allow_commands={settings['allow_commands']!r}; give true or false")
    kinds = list(model.tokenizers)
    frontend = model.frontend                   # features as the model was trained on (from its checkpoint)
    settings["num_mel_bins"] = frontend.num_mel_bins
    settings["specaugment"] = False
    settings["progress"] = overrides.get("progress", progress)
    if data_dir is not None:
        root = kaldi_manifests(data_dir, Path(settings["root"]) if "root" in overrides
                               else Path(data_dir) / "asr_manifests", progress,
                               skip_bad_audio=bool(overrides.get("skip_bad_audio", False)),
                               allow_commands=settings["allow_commands"])
        # A Kaldi directory has word transcripts only: the phone heads decode but are not scored.
        scored = [kind for kind in kinds if model.tokenizers[kind].field == "text"]
        settings.update(corpus=KALDI_CORPUS, root=str(root), test_split=KALDI_SPLIT, dev_split=KALDI_SPLIT,
                        train_split=KALDI_SPLIT, targets=scored or kinds)
        split, source = KALDI_SPLIT, f"Kaldi data directory {data_dir}"
        if not scored:
            raise EvaluationError(f"data_dir={str(data_dir)!r} has word transcripts only, but this model's "
                                  f"heads are {kinds}; it needs a chars or sentencepiece head to be scored")
    else:
        if "corpus" in overrides and "root" not in overrides and overrides["corpus"] != trained.get("corpus"):
            settings["root"] = default_root(overrides["corpus"])   # another corpus: where its recipe writes
        if "root" not in settings:
            raise EvaluationError(f"{checkpoint} is not inside an asr.train run folder (no ../config.yaml), "
                                  "so its corpus is unknown: give data.corpus=... (data.root=...) or data_dir=...")
        settings["targets"] = kinds
        scored = kinds
    config = _evaluation_data_config(settings, overrides)
    split = split or config.test_split
    config.test_split = split
    corpus = Corpus.of(config)
    if data_dir is None:
        check_split(corpus, split, config.feature_cache_folder, settings["progress"])
    datamodule = SpeechDataModule(config, frame_subsampling=model.encoder.subsampling, filterbank=frontend,
                                  corpus=corpus)
    datamodule.set_tokenizers({kind: model.tokenizers[kind].state_dict() for kind in config.targets})
    source = source if data_dir is not None else str(cuts_path(config.root, config.corpus, split))
    return EvaluationData(datamodule, split, scored, source)

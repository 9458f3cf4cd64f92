"""Scoring a checkpoint: the evaluation library behind `python -m asr.evaluate`, asr.cross_matrix,
asr.tune_lm, asr.transcribe, the decoding benchmark and the end of asr.train.

The flow: `load_model` (any checkpoint, through asr.model.checkpoint) -> `evaluation_attention`
(the trained one, or a spec and options swapped in) -> `evaluation_data` (a split of the model's
corpus, another corpus, or a Kaldi-style folder) -> `decode_split` (greedy, beam or lexicon + LM
decoding, error rates per head, forward time) -> `evaluate` writes results.json and the
hypotheses. `lexicon_word_decoding` gives asr.train's test pass its words, `real_speech_rates` its real-speech line.
"""
from __future__ import annotations

import hashlib
import json
import logging
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

import torch

from asr.core.errors import closest_name
from asr.data.datamodule import DataConfig, SpeechDataModule, as_data_config, validate_data_config
from asr.data.dataset import batch_references
from asr.data.manifests import ManifestError, corpus_root, cuts_path, default_root, other_corpora
from asr.evaluation.decoding.lexicon import LexiconFileError
from asr.evaluation.decoding.ngram import LanguageModelError
from asr.model.checkpoint import HYPER_PARAMETERS, CheckpointError, read_checkpoint
from asr.model.encoder import check_attention_fits
from asr.model.ctc import DECODERS as CTC_DECODERS, decode_transcripts
from asr.model.recognizer import (EVALUATION_SEED, EvaluationTally, SpeechRecognizer,
                                  seed_evaluation_batch)
from asr.model.run_folder import run_folder_of, trained_data_config
from attention_ext import (AttentionConfigError, ValidatedAttention, parse_attention_spec, runs_in_reformer_form,
                           validate_attention)

log = logging.getLogger("asr.evaluate")
KALDI_CORPUS, KALDI_SPLIT = "kaldi", "eval"
# data.* options that change how fast an evaluation runs or what it shows, not its numbers
DATA_OPTIONS_WITHOUT_EFFECT = ("progress", "num_workers", "feature_jobs", "precompute_features")


DECODERS = (*CTC_DECODERS, "lexicon")   # lexicon: words through a lexicon and an n-gram LM (asr.evaluation.decoding)


class EvaluationError(ValueError):
    """An argument, checkpoint or data source that cannot be evaluated; the message says what to do."""


@dataclass
class EvaluateConfig:
    checkpoint: Optional[str] = None     # the .ckpt to evaluate (required)
    attention: Optional[str] = None      # evaluate-with spec; None: the one the model was trained with
    split: Optional[str] = None          # a split of the corpus; None: its test split
    data_dir: Optional[str] = None       # a Kaldi-style data directory to score instead of a split
    data: dict = field(default_factory=dict)   # data.<key>=... overrides of the run's data config
    decoder: str = "greedy"              # greedy | beam (CTC prefix beam search, no LM) | lexicon (+ LM)
    beam_size: int = 8
    lexicon: Optional[str] = None        # decoder=lexicon: word -> phones file (needs lm=); None: the model's
    lm: Optional[str] = None             # ARPA (.arpa/.arpa.gz); None: the model's; none: no LM
    extra_lexicon: Optional[str] = None  # decoder=lexicon: entries added on top of the lexicon
    reference_lexicon: Optional[str] = None  # word -> phones: phone references for word-only data (data_dir)
    lm_weight: float = 1.0
    word_score: float = 0.0
    beam: int = 50                       # the lexicon decoder's beam
    restrict_lexicon: bool = False       # decode only the lexicon words the LM knows (else: <unk> probability)
    decode_workers: Optional[int] = None  # lexicon decoding processes; None: min(4, CPUs)
    # Keys of a shared-QK model under full, clustered, i-clustered, oracle-top: trained (the form
    # the model was trained with; unit keys, no attention to self after shared_full or lsh) | raw
    shared_qk_keys: str = "trained"
    seed: int = EVALUATION_SEED          # seeds the random hashing of clustered / LSH attention
    device: str = "cpu"                  # cpu | cuda | cuda:N
    threads: Optional[int] = None        # torch.set_num_threads; None: torch's default
    limit: Optional[int] = None          # evaluate only the first N batches (a quick look)
    out: Optional[str] = None            # output folder
    progress: bool = True


# What a user's arguments can get wrong in every command that scores or decodes a checkpoint
# (asr.evaluate, asr.cross_matrix, asr.tune_lm): each is one line and exit status 2.
USAGE_ERRORS = (EvaluationError, AttentionConfigError, ManifestError, CheckpointError, LexiconFileError,
                LanguageModelError)


def check_decoding_options(config: Any) -> None:
    """The decoding options asr.evaluate and asr.transcribe share (decoder, beam_size, lexicon, lm,
    extra_lexicon, device), checked before anything is loaded: EvaluationError saying what to give."""
    if config.decoder not in DECODERS:
        raise EvaluationError(f"decoder={config.decoder!r}; choose one of {', '.join(DECODERS)}")
    if config.beam_size < 1:
        raise EvaluationError(f"beam_size={config.beam_size} must be >= 1")
    from asr.evaluation.decoding.evaluation import check_lexicon_options
    try:
        check_lexicon_options(config.decoder, config.lexicon, config.lm, config.extra_lexicon)
    except LexiconFileError as error:
        raise EvaluationError(str(error)) from None
    check_device(config.device)


def check_device(device: str) -> None:
    """EvaluationError unless `device` names a device this torch can use."""
    try:
        kind = torch.device(device).type
    except RuntimeError:
        raise EvaluationError(f"device={device!r} is not a device; e.g. cpu, cuda, cuda:1") from None
    if kind == "cuda" and not torch.cuda.is_available():
        raise EvaluationError(f"device={device!r}, but this torch sees no CUDA GPU; use device=cpu")


def evaluation_attention(model: SpeechRecognizer, spec: str | None,
                         options: dict[str, Any] | None = None) -> ValidatedAttention:
    """The attention to evaluate with: `spec` plus `options`, or the training attention when
    both are empty; options alone modify the training attention (e.g. more clusters). Checked
    here, once, against the model (check_attention_fits): the encoder takes it as it is."""
    base = parse_attention_spec(spec) if spec is not None else validate_attention(**model.hparams.attention)
    attention = base
    if options:
        merged = dict(base.options)
        for key, value in options.items():
            try:
                merged[key] = int(value)
            except (TypeError, ValueError):
                raise AttentionConfigError(f"attention.{key}={value!r} is not a whole number") from None
        attention = validate_attention(base.name, **merged)
    check_attention_fits(attention, model.encoder.shared_qk, model.encoder.head_dim)
    return attention


# shared_qk_keys=...: the keys a shared-QK model gets from attentions defined for separate keys
# (full, clustered, iclustered, oracle_top). A model trained with shared_full or lsh learned the
# Reformer conventions (unit-normalised keys, no attention to self unless nothing else), which
# those attentions then follow (attention_ext.reformer_key_form); "raw" gives them keys equal to
# the raw queries, self allowed, as every evaluation did before issue 31.
SHARED_QK_KEYS = {"trained": "the key form the model was trained with",
                  "raw": "keys equal to the raw queries, attention to self allowed"}
# What the attention of an evaluation saw as keys (results.json and cross-matrix cells: key_form)
KEY_FORMS = {"separate": "the key projection (no shared QK)",
             "reformer": "unit-normalised queries, no attention to self (Reformer)",
             "queries": "the raw queries, attention to self allowed"}


def check_shared_qk_keys(value: str, option: str = "shared_qk_keys") -> None:
    """EvaluationError naming `option` unless `value` is one of SHARED_QK_KEYS."""
    if value not in SHARED_QK_KEYS:
        choices = "; ".join(f"{name} ({meaning})" for name, meaning in SHARED_QK_KEYS.items())
        raise EvaluationError(f"{option}={value!r} is not a key form; choose {choices}")


def evaluation_key_form(shared_qk: bool, trained_attention: str, attention: ValidatedAttention,
                        shared_qk_keys: str) -> str:
    """The KEY_FORMS entry `attention` runs with on a model with or without shared QK trained with
    `trained_attention`, under shared_qk_keys (SHARED_QK_KEYS)."""
    if not shared_qk:
        return "separate"
    if attention.needs_shared_qk:       # shared_full, lsh: the Reformer conventions are their definition
        return "reformer"
    trained_reformer = validate_attention(trained_attention).needs_shared_qk
    if shared_qk_keys == "trained" and trained_reformer and runs_in_reformer_form(attention.name):
        return "reformer"
    return "queries"


def set_evaluation_attention(model: SpeechRecognizer, attention: ValidatedAttention, shared_qk_keys: str) -> str:
    """Swaps `attention` into the model in the key form shared_qk_keys asks for; returns that
    form (KEY_FORMS). Refuses, changing nothing, what model.set_attention refuses."""
    key_form = evaluation_key_form(model.encoder.shared_qk, model.hparams.attention["name"], attention,
                                   shared_qk_keys)
    model.set_attention(attention, reformer_keys=key_form == "reformer")
    return key_form


def attention_label(name: str, options: dict[str, int]) -> str:
    """'iclustered' + {clusters: 64, ...} -> 'iclustered_clusters64_bits63_...' (a folder name)."""
    return "_".join([name] + [f"{key}{value}" for key, value in sorted(options.items())])


def load_model(checkpoint: str | Path, device: str = "cpu") -> SpeechRecognizer:
    """The trained model of an asr.train checkpoint, in eval mode on `device`; CheckpointError
    (one line naming the file) if the file cannot be used."""
    saved = read_checkpoint(checkpoint)
    where = f"checkpoint {checkpoint}"
    try:
        model = SpeechRecognizer(**{key: saved["hyper_parameters"][key] for key in HYPER_PARAMETERS})
    except (KeyError, TypeError, ValueError) as error:
        raise CheckpointError(f"{where}: its hyper_parameters do not build a model ({error})") from None
    try:
        model.load_state_dict(saved["state_dict"])
    except RuntimeError:
        raise CheckpointError(f"{where}: its weights do not fit the model its hyper_parameters describe "
                              "(a damaged or hand-edited checkpoint?)") from None
    return model.to(device).eval()



def kaldi_manifests(data_dir: str | Path, out_dir: Path, progress: bool = True, skip_bad_audio: bool = False) -> Path:
    """Converts a Kaldi-style data directory into the manifests asr.data reads (split 'eval' of
    corpus 'kaldi') under out_dir; the audio is converted once and reused by later runs.
    Unreadable, empty, multi-channel audio stops it with the recipe's list of problems, or with
    data.skip_bad_audio=true is left out and counted (the recipes' --bad-data drop)."""
    from asr.data.kaldi_dir import KaldiDataDirError, read_kaldi_data_dir
    from asr.data.manifest_builder import (NoUtterancesError, PreparationError, Problem, RecordingSpec,
                                          UtteranceSpec, build_manifests, file_identity)
    from asr.text.normalisation import normalise_transcript
    try:
        kaldi = read_kaldi_data_dir(data_dir, require_utt2spk=False)
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
    if report.get("dropped_utterances"):
        log.warning("data_dir=%s: left out %d utterances (data.skip_bad_audio=true; the list is in %s)", data_dir,
                    report["dropped_utterances"], out_dir / f"{KALDI_CORPUS}_report.json")
    return out_dir


def prepare_missing_split(config: DataConfig, split: str, progress: bool = True) -> None:
    """Prepares the corpus into data.root when the split's manifest is missing and a preparer is
    in its recipe (asr.data.corpus_recipes: synth, asterisk), as asr.train does; for any other
    corpus, or a folder holding the split under another corpus name (data.corpus forgotten), the
    missing manifest is load_cuts' error saying what to do. A preparer that fails (a package to
    install, a damaged file) is one EvaluationError line."""
    from asr.data.corpus_recipes import corpus_preparer
    root = corpus_root(config.root)
    if cuts_path(root, config.corpus, split).is_file() or other_corpora(root, config.corpus, split):
        return
    preparer = corpus_preparer(config.corpus)
    if preparer is None:
        return
    log.info("corpus %s: no %s manifest in %s, preparing the corpus there (once)", config.corpus, split, root)
    try:
        preparer(root, progress=progress)
    except (ValueError, RuntimeError, OSError) as error:   # a preparer's own errors: usage, problems, files
        raise EvaluationError(f"data.corpus={config.corpus}: preparing its manifests in {config.root} failed: "
                              f"{error}") from error


@dataclass
class EvaluationData:
    """What to score: a data module with the model's tokenizers, the split, the heads with references."""
    datamodule: SpeechDataModule
    split: str
    scored: list[str]            # target kinds whose references the data has
    source: str                  # for the report: the manifest or the Kaldi directory


def evaluation_data(model: SpeechRecognizer, checkpoint: str | Path, split: str | None = None,
                    data_dir: str | Path | None = None, data_overrides: dict | None = None,
                    progress: bool = True) -> EvaluationData:
    """The data to score `model` on: a split of its training corpus (or the corpus data.* names),
    or a Kaldi-style directory converted to manifests (and features) in data.root, by default
    <data_dir>/asr_manifests, where later evaluations find them again.

    What the command line gives wins over the run folder's stored config: data.<key> overrides,
    and `progress` (unless data.progress is given) over the stored data.progress. An override
    that would be ignored is an error: an unknown key, or one the model fixes (its feature bins,
    its heads, no SpecAugment)."""
    overrides = dict(data_overrides or {})
    unknown = sorted(set(overrides) - set(DataConfig.__dataclass_fields__))
    if unknown:
        meant = closest_name(unknown[0], DataConfig.__dataclass_fields__)
        raise EvaluationError(f"data.{unknown[0]} is not a data option; did you mean data.{meant}?" if meant else
                              f"data.{unknown[0]} is not a data option; they are: "
                              f"{', '.join(DataConfig.__dataclass_fields__)}")
    settings = {**trained_data_config(checkpoint), **overrides}
    kinds = list(model.tokenizers)
    frontend = model.frontend                   # features as the model was trained on (from its checkpoint)
    settings["num_mel_bins"] = frontend.num_mel_bins
    settings["specaugment"] = False
    settings["progress"] = overrides.get("progress", progress)
    if data_dir is not None:
        root = kaldi_manifests(data_dir, Path(settings["root"]) if "root" in overrides
                               else Path(data_dir) / "asr_manifests", progress,
                               skip_bad_audio=bool(overrides.get("skip_bad_audio", False)))
        # A Kaldi directory has word transcripts only: the phone heads decode but are not scored.
        scored = [kind for kind in kinds if model.tokenizers[kind].field == "text"]
        settings.update(corpus=KALDI_CORPUS, root=str(root), test_split=KALDI_SPLIT, dev_split=KALDI_SPLIT,
                        train_split=KALDI_SPLIT, targets=scored or kinds)
        split, source = KALDI_SPLIT, f"Kaldi data directory {data_dir}"
        if not scored:
            raise EvaluationError(f"data_dir={str(data_dir)!r} has word transcripts only, but this model's "
                                  f"heads are {kinds}; it needs a chars or sentencepiece head to be scored")
    else:
        trained = trained_data_config(checkpoint)
        if "corpus" in overrides and "root" not in overrides and overrides["corpus"] != trained.get("corpus"):
            settings["root"] = default_root(overrides["corpus"])   # another corpus: where its recipe writes
        if "root" not in settings:
            raise EvaluationError(f"{checkpoint} is not inside an asr.train run folder (no ../config.yaml), "
                                  "so its corpus is unknown: give data.corpus=... (data.root=...) or data_dir=...")
        settings["targets"] = kinds
        scored = kinds
    for key in ("num_mel_bins", "specaugment", "targets"):
        if key in overrides and overrides[key] != settings[key]:
            raise EvaluationError(f"data.{key}={overrides[key]!r} cannot be changed for an evaluation: "
                                  f"the model sets it to {settings[key]!r}")
    try:
        config = as_data_config({key: value for key, value in settings.items()
                                 if key in DataConfig.__dataclass_fields__})
        validate_data_config(config)
    except (ValueError, TypeError) as error:
        raise EvaluationError(f"data: {error}") from None
    split = split or config.test_split
    config.test_split = split
    if data_dir is None:
        prepare_missing_split(config, split, settings["progress"])
    datamodule = SpeechDataModule(config, frame_subsampling=model.encoder.subsampling, filterbank=frontend)
    datamodule.set_tokenizers({kind: model.tokenizers[kind].state_dict() for kind in config.targets})
    source = source if data_dir is not None else str(cuts_path(config.root, config.corpus, split))
    return EvaluationData(datamodule, split, scored, source)


@dataclass
class EvaluationResult:
    rates: dict[str, float]
    utterances: list[dict]          # id, and per kind: reference (if scored) and hypothesis
    forward_seconds: float          # encoder + heads, summed over batches
    input_frames: int               # 10 ms feature frames
    encoder_frames: int
    audio_seconds: float
    decode_seconds: float = 0.0     # wall time of the whole split: forward, decoding, scoring
    missing_words: list = field(default_factory=list)   # transcript words the reference lexicon lacks
    out_of_vocabulary: Optional[dict] = None   # decoder=lexicon: reference words the LM / lexicon lack

    def timing(self) -> dict[str, float]:
        count = max(1, len(self.utterances))
        return {"forward_seconds": self.forward_seconds,
                "forward_ms_per_utterance": 1e3 * self.forward_seconds / count,
                "forward_us_per_frame": 1e6 * self.forward_seconds / max(1, self.input_frames),
                "forward_us_per_encoder_frame": 1e6 * self.forward_seconds / max(1, self.encoder_frames),
                "real_time_factor": self.forward_seconds / max(1e-9, self.audio_seconds)}


def _synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _add_pronounced_references(references: dict, texts: list[str], tokenizers: dict, reference_lexicon: dict,
                                missing_words: dict[str, int]) -> None:
    """Gives a phone head that has no references (data with word transcripts only) the transcripts'
    pronunciations from reference_lexicon; counts the words it lacks in missing_words."""
    from asr.evaluation.decoding.lexicon import words_to_phones
    for kind, tokenizer in tokenizers.items():
        if tokenizer.field == "phones" and kind not in references:
            references[kind] = []
            for text in texts:
                phones, missing = words_to_phones(text, reference_lexicon)
                references[kind].append(phones)
                for word in missing:
                    missing_words[word] = missing_words.get(word, 0) + 1


def _collect_lexicon_words(pending: list, rates: dict, parallel_decoder, progress: bool) -> dict:
    """Waits for the lexicon decoder's words of each (record, reference words, result) in pending, puts
    them into the records and their rates into `rates` (WER and CER are then the lexicon's), and
    returns the out-of-vocabulary report."""
    from tqdm.auto import tqdm
    from asr.evaluation.decoding.evaluation import out_of_vocabulary_report, word_rates
    words = tqdm(pending, desc="lexicon decoding", unit="utt", disable=not progress, leave=False)
    for record, _, result in words:
        record["lexicon"] = {"hypothesis": result.get()}
    references = [reference for _, reference, _ in pending]
    rates.update(word_rates(references, [record["lexicon"]["hypothesis"] for record, _, _ in pending]))
    for record, reference, _ in pending:
        record["lexicon"]["reference"] = reference
    rates["wer"], rates["cer"] = rates["wer_lexicon"], rates["cer_lexicon"]
    return out_of_vocabulary_report(references, parallel_decoder.local)


@torch.no_grad()
def decode_split(model: SpeechRecognizer, data: EvaluationData, decoder: str = "greedy", beam_size: int = 8,
                 seed: int = EVALUATION_SEED, limit: int | None = None, progress: bool = True,
                 word_decoder=None, reference_lexicon: dict | None = None) -> EvaluationResult:
    """Decodes every utterance of the split; times the model's forward pass (not the decoding).

    word_decoder: (head, ParallelLexiconDecoder) of decoder=lexicon; its workers decode while the
    model computes the next batch. reference_lexicon: word -> pronunciations, to score a phone
    head the data has no phones for (a Kaldi directory) against the word transcripts'
    pronunciations; never the decoding lexicon, so PER does not change with it."""
    from tqdm.auto import tqdm
    model.eval()
    started = time.perf_counter()
    pending: list = []                  # (record, reference words, the worker's result)
    missing_words: dict[str, int] = {}
    device = model.device
    loader = data.datamodule.dataloader(data.split)
    tally = EvaluationTally()
    records: list[dict] = []
    forward_seconds, input_frames = 0.0, 0
    bar = tqdm(loader, desc=f"decode {data.split}", unit="batch", disable=not progress, leave=False)
    for index, batch in enumerate(bar):
        if limit is not None and index >= limit:
            break
        features = batch["features"].to(device)
        lengths = batch["feature_lengths"].to(device)
        seed_evaluation_batch(seed, index)    # as asr.train's validation and test do
        _synchronize(device)
        start = time.perf_counter()
        log_probs, out_lengths = model(features, lengths)
        _synchronize(device)
        forward_seconds += time.perf_counter() - start
        input_frames += int(lengths.sum())
        word_heads = "beam" if decoder == "beam" else "greedy"   # decoder=lexicon: greedy per head, words below
        hypotheses = {kind: decode_transcripts(scores, out_lengths, model.tokenizers[kind], word_heads, beam_size)
                      for kind, scores in log_probs.items()}
        references = batch_references(batch, {kind: model.tokenizers[kind].field for kind in data.scored})
        if reference_lexicon is not None:
            _add_pronounced_references(references, batch["texts"], model.tokenizers, reference_lexicon, missing_words)
        tally.add(hypotheses, references, out_lengths)
        batch_records = [{"id": utterance_id, **{
            kind: {"hypothesis": hypotheses[kind][i],
                   **({"reference": references[kind][i]} if kind in references else {})}
            for kind in hypotheses}} for i, utterance_id in enumerate(batch["ids"])]
        if word_decoder is not None:
            head, parallel = word_decoder
            rows = log_probs[head].cpu().numpy()
            for i, record in enumerate(batch_records):
                pending.append((record, batch["texts"][i], parallel.submit(rows[i, :int(out_lengths[i])])))
        records.extend(batch_records)
    bar.close()
    if not records:
        raise EvaluationError(f"split {data.split!r} of {data.source} has no utterances")
    scored_tokenizers = {kind: model.tokenizers[kind] for kind in tally.references}
    rates = tally.error_rates(scored_tokenizers)
    out_of_vocabulary = None
    if pending:
        out_of_vocabulary = _collect_lexicon_words(pending, rates, word_decoder[1], progress)
    if missing_words:
        shown = ", ".join(sorted(missing_words, key=missing_words.get, reverse=True)[:10])
        log.warning("%d words of the transcripts are not in the reference lexicon (phone references lack "
                    "them): %s", len(missing_words), shown)
    audio_seconds = input_frames * 0.01          # 10 ms frame shift
    return EvaluationResult(rates, records, forward_seconds, input_frames, tally.encoder_frames, audio_seconds,
                            time.perf_counter() - started, sorted(missing_words), out_of_vocabulary)


def default_out_dir(config: EvaluateConfig, split: str, label: str) -> Path:
    """<run folder>/evaluations/<name> (evaluations/<checkpoint name>/<name> outside a run folder),
    where the name holds every option that changes the numbers, so two evaluations that can
    differ never overwrite each other: split, attention and its options (and _reformer-keys where a
    shared-QK model runs a separate-key attention in its Reformer key form), decoder (and beam size),
    seed, device, limit, and the data source (data_dir, data.* overrides) as a short hash, e.g.
    test_iclustered_bits63_clusters100_iterations10_topk32_greedy_seed0_cpu."""
    run = run_folder_of(config.checkpoint)
    base = run / "evaluations" if run is not None else Path("evaluations") / Path(config.checkpoint).stem
    decoder = {"greedy": "greedy", "beam": f"beam{config.beam_size}"}.get(config.decoder) or lexicon_label(config)
    parts = [split, label, decoder, f"seed{config.seed}", config.device.replace(":", "")]
    if config.limit is not None:
        parts.append(f"limit{config.limit}")
    data = {key: value for key, value in config.data.items() if key not in DATA_OPTIONS_WITHOUT_EFFECT}
    if config.data_dir or data or config.reference_lexicon:
        source = {"data_dir": str(Path(config.data_dir).resolve()) if config.data_dir else None, "data": data}
        if config.reference_lexicon:       # (only then: the names of earlier evaluations stay as they were)
            source["reference_lexicon"] = str(Path(config.reference_lexicon).resolve())
        parts.append("data" + hashlib.sha1(json.dumps(source, sort_keys=True).encode()).hexdigest()[:8])
    return base / "_".join(parts)


def lexicon_label(config: EvaluateConfig) -> str:
    """lexicon_lmw1.0_ws0.0_beam50_<hash of the lexicon and LM paths>: a folder-name part."""
    files = [config.lexicon, config.lm, config.restrict_lexicon] + ([config.extra_lexicon] if config.extra_lexicon else [])
    files = json.dumps(files)
    return (f"lexicon_lmw{config.lm_weight}_ws{config.word_score}_beam{config.beam}_"
            + hashlib.sha1(files.encode()).hexdigest()[:6])


def write_outputs(out: Path, result: EvaluationResult, report: dict) -> None:
    out.mkdir(parents=True, exist_ok=True)
    with open(out / "hypotheses.jsonl", "w") as handle:
        for record in result.utterances:
            handle.write(json.dumps(record) + "\n")
    kinds = [key for key in result.utterances[0] if key != "id"]
    for kind in kinds:
        (out / f"hyp_{kind}.txt").write_text(
            "".join(f"{r['id']} {r[kind]['hypothesis']}\n" for r in result.utterances))
    (out / "results.json").write_text(json.dumps(report, indent=2) + "\n")


def evaluate(config: EvaluateConfig, attention_options: dict[str, str] | None = None) -> dict:
    """Runs one evaluation as configured; returns (and writes) the results.json content."""
    check_shared_qk_keys(config.shared_qk_keys)
    if config.threads:
        torch.set_num_threads(config.threads)
    model = load_model(config.checkpoint, config.device)
    trained = dict(model.hparams.attention)
    attention = evaluation_attention(model, config.attention, attention_options)
    # refuses lsh / shared_full without shared QK
    key_form = set_evaluation_attention(model, attention, config.shared_qk_keys)
    label = attention_label(attention.name, attention.options)
    if key_form == "reformer" and not attention.needs_shared_qk:   # other numbers than the raw form's
        label += "_reformer-keys"
    lexicon_settings = None
    if config.decoder == "lexicon":         # the model's files unless given, checked before any data work
        from asr.evaluation.decoding.evaluation import settings_from_command
        from asr.model.decoding_files import model_decoding_files
        lexicon_settings = settings_from_command(config, model_decoding_files(config.checkpoint))
    reference_lexicon = (read_reference_lexicon(config.reference_lexicon, model)
                         if config.reference_lexicon else None)
    split_name = KALDI_SPLIT if config.data_dir else config.split
    out = Path(config.out) if config.out else None
    data = evaluation_data(model, config.checkpoint, split_name, config.data_dir, dict(config.data),
                           progress=config.progress)
    out = out or default_out_dir(config, data.split, label)
    word_decoder = None
    if lexicon_settings is not None:
        from asr.evaluation.decoding.evaluation import start_word_decoder
        word_decoder = start_word_decoder(model.tokenizers, lexicon_settings, config.decode_workers)
    try:
        result = decode_split(model, data, config.decoder, config.beam_size, config.seed, config.limit,
                              config.progress, word_decoder, reference_lexicon)
    finally:
        if word_decoder is not None:
            word_decoder[1].close()
    lexicon_decoder = None
    if word_decoder is not None:
        decoder = word_decoder[1].local
        lexicon_decoder = dict(lexicon_settings.describe(), head=word_decoder[0],
                               lexicon_words=len(decoder.lexicon_words),
                               lexicon_words_outside_lm=len(decoder.words_outside_lm))
    report = {
        "checkpoint": str(config.checkpoint), "data": data.source, "split": data.split,
        "trained_with": trained, "evaluated_with": attention.as_config(),
        "same_as_training": attention.as_config() == trained,
        "key_form": key_form, "shared_qk_keys": config.shared_qk_keys,
        "decoder": {"greedy": "greedy", "beam": f"beam (size {config.beam_size})"}.get(config.decoder, "lexicon"),
        "lexicon_decoder": lexicon_decoder, "out_of_vocabulary": result.out_of_vocabulary,
        "reference_lexicon": config.reference_lexicon,
        "decode_seconds": result.decode_seconds, "words_missing_from_reference_lexicon": result.missing_words,
        "seed": config.seed, "limit": config.limit, "data_overrides": dict(config.data),
        "utterances": len(result.utterances), "scored_heads": data.scored,
        "error_rates": result.rates, **result.timing(),
        "device": str(model.device), "threads": torch.get_num_threads(), "torch": torch.__version__,
    }
    write_outputs(out, result, report)
    report["out"] = str(out)
    return report


def read_reference_lexicon(path: str, model: SpeechRecognizer) -> dict:
    """reference_lexicon=PATH: word -> pronunciations, checked against the model's phone head."""
    from asr.evaluation.decoding.lexicon import check_lexicon_phones, read_lexicon
    phone_heads = [tokenizer for tokenizer in model.tokenizers.values() if tokenizer.kind == "phones"]
    if not phone_heads:
        raise EvaluationError(f"reference_lexicon={path} gives phone references, but this model has no phone "
                              f"head (its heads: {', '.join(model.tokenizers)})")
    lexicon = read_lexicon(path)
    check_lexicon_phones(lexicon, phone_heads[0].symbols, path)
    return lexicon


def lexicon_word_decoding(checkpoint: str | Path, tokenizers: dict, workers: int | None = None):
    """asr.train's words for its test pass: a BatchWordDecoding (asr.evaluation.decoding.evaluation) with the
    model's lexicon and LM (model_decoding_files; asr.evaluate decoder=lexicon's default settings),
    or None when the model has not both, or when they cannot be read (said in a warning: the training
    itself went well)."""
    from asr.evaluation.decoding.evaluation import BatchWordDecoding, settings_from_command
    from asr.model.decoding_files import model_decoding_files
    from asr.evaluation.decoding.lexicon import LexiconFileError
    from asr.evaluation.decoding.ngram import LanguageModelError
    files = model_decoding_files(checkpoint)
    if files.lexicon is None or files.lm is None:
        return None
    try:
        return BatchWordDecoding(tokenizers, settings_from_command(EvaluateConfig(decoder="lexicon"), files), workers)
    except (LexiconFileError, LanguageModelError) as error:
        logging.getLogger("asr.decoding").warning("no lexicon decoding of the test split: %s", error)
        return None


def real_speech_rates(checkpoint: str | Path, corpus: str, training_root: str | Path,
                      progress: bool = True) -> dict:
    """asr.train's closing real-speech line: the test split of `corpus` (e.g. asterisk, prepared
    beside the training corpus, {training_root}/../{corpus}, on first use) scored with the model's
    greedy PER and, when the model has a lexicon and LM, lexicon + LM WER with the corpus's own
    lexicon.txt added to the model's (its words outside the LM get <unk>'s probability; the OOV rate
    against the LM says how many)."""
    from asr.model.decoding_files import model_decoding_files
    root = Path(training_root).parent / corpus
    files = model_decoding_files(checkpoint)
    words = files.lexicon is not None and files.lm is not None
    config = EvaluateConfig(checkpoint=str(checkpoint), split="test", data={"corpus": corpus, "root": str(root)},
                            decoder="lexicon" if words else "greedy", progress=progress)
    if words and (root / "lexicon.txt").is_file():
        config.extra_lexicon = str(root / "lexicon.txt")
    try:
        report = evaluate(config)
    except EvaluationError as error:
        # the training went well; a real-speech set that cannot be had (its Debian packages missing) is said, not fatal
        logging.getLogger("asr.evaluation").warning("no real-speech test (%s): %s", corpus, error)
        return {}
    rates = report["error_rates"]
    result = {"corpus": corpus, "per": rates.get("per"), "evaluation": report["out"]}
    if words:
        result.update(wer_lexicon=rates["wer_lexicon"], oov_lm=report["out_of_vocabulary"]["lm"])
    return result

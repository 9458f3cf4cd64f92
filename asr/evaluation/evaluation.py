"""Scoring a checkpoint: the evaluation library behind `python -m asr.evaluate`, asr.cross_matrix,
asr.tune_lm, asr.transcribe, the decoding benchmark and the end of asr.train.

The flow: `load_model` (any checkpoint, through asr.model.checkpoint) -> `evaluation_attention`
(attention_choice.py: the trained one, or a spec and options swapped in) -> `evaluation_data`
(evaluation_data.py: a split of the model's corpus, another corpus, or a Kaldi-style folder) ->
`decode_split` (split_decoding.py: greedy, beam or lexicon + LM decoding, error rates per head,
forward time) -> `evaluate` writes results.json and the hypotheses. `lexicon_word_decoding` gives asr.train's test pass its words, `real_speech_rates` its real-speech line.
"""
from __future__ import annotations

import hashlib
import json
import logging
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

import torch

from asr.core.errors import EvaluationError
from asr.core.output_paths import disk_full, unwritable_reason
from asr.data.corpus.corpus import Corpus
from asr.data.corpus.manifests import ManifestError
from asr.evaluation.attention_choice import (attention_label, check_shared_qk_keys, evaluation_attention,
                                           set_evaluation_attention)
from asr.evaluation.decoding.lexicon import LexiconFileError
from asr.evaluation.decoding.ngram import LanguageModelError
from asr.evaluation.evaluation_data import KALDI_SPLIT, evaluation_data
from asr.evaluation.split_decoding import EvaluationResult, decode_split
from asr.model.checkpoint import HYPER_PARAMETERS, CheckpointError, read_checkpoint
from asr.model.ctc import DECODERS as CTC_DECODERS
from asr.model.recognizer import EVALUATION_SEED, SpeechRecognizer
from asr.model.run_folder import run_folder_of
from attention_ext import AttentionConfigError

log = logging.getLogger("asr.evaluate")
# data.* options that change how fast an evaluation runs or what it shows, not its numbers
DATA_OPTIONS_WITHOUT_EFFECT = ("progress", "num_workers", "feature_jobs", "precompute_features")


DECODERS = (*CTC_DECODERS, "lexicon")   # lexicon: words through a lexicon and an n-gram LM (asr.evaluation.decoding)


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
    seed: int = EVALUATION_SEED          # seeds the random hashing of clustered / LSH attention (>= 0)
    device: str = "cpu"                  # cpu | cuda | cuda:N
    threads: Optional[int] = None        # torch.set_num_threads (>= 1); None: torch's default
    limit: Optional[int] = None          # evaluate only the first N batches (a quick look)
    out: Optional[str] = None            # output folder
    progress: bool = True


# What a user's arguments can get wrong in every command that scores or decodes a checkpoint
# (asr.evaluate, asr.cross_matrix, asr.tune_lm): each is one line and exit status 2.
USAGE_ERRORS = (EvaluationError, AttentionConfigError, ManifestError, CheckpointError, LexiconFileError,
                LanguageModelError)


def check_decoding_options(config: Any) -> None:
    """The decoding options asr.evaluate and asr.transcribe share (decoder, beam_size, lexicon, lm,
    extra_lexicon, lm_weight, word_score, beam, seed, threads, device), checked before anything is loaded:
    EvaluationError saying what to give."""
    if config.decoder not in DECODERS:
        raise EvaluationError(f"decoder={config.decoder!r}; choose one of {', '.join(DECODERS)}")
    if config.beam_size < 1:
        raise EvaluationError(f"beam_size={config.beam_size} must be >= 1")
    # NaN or an infinite weight makes every hypothesis's score NaN or infinite, and the lexicon
    # decoder then returns nothing: an empty transcript scored as 100% WER, not an error
    for name in ("lm_weight", "word_score"):
        if not math.isfinite(getattr(config, name)):
            raise EvaluationError(f"{name}={getattr(config, name)} must be a finite number (e.g. {name}="
                                  f"{getattr(type(config), name)})")
    if config.beam < 1:
        raise EvaluationError(f"beam={config.beam} must be >= 1 (the lexicon decoder's hypotheses kept per frame)")
    if config.seed < 0:
        raise EvaluationError(f"seed={config.seed} must be a whole number >= 0 (it seeds clustered and LSH attention)")
    if config.threads is not None and config.threads < 1:
        raise EvaluationError(f"threads={config.threads} must be a number of threads >= 1, or null (torch's default)")
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


def check_out_folder(out: Path, given: bool) -> None:
    """EvaluationError when the results folder `out` cannot be written (given as out=, or the default
    one in the checkpoint's run folder)."""
    reason = unwritable_reason(out, folder=True)
    if reason is not None:
        where = f"out={out}" if given else f"the results folder {out} (beside the checkpoint)"
        raise EvaluationError(f"{where} cannot be written: {reason}; give a folder you can write to with out=FOLDER")


def write_outputs(out: Path, result: EvaluationResult, report: dict) -> None:
    try:
        _write_outputs(out, result, report)
    except OSError as error:
        full = disk_full(error, out)
        if full is not None:
            raise full from None
        raise


def _write_outputs(out: Path, result: EvaluationResult, report: dict) -> None:
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
    if out is not None:   # before any data is prepared; the default folder is known once the split is
        check_out_folder(out, given=True)
    data = evaluation_data(model, config.checkpoint, split_name, config.data_dir, dict(config.data),
                           progress=config.progress)
    if out is None:
        out = default_out_dir(config, data.split, label)
        check_out_folder(out, given=False)   # before decoding, not after it
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


def real_speech_rates(checkpoint: str | Path, corpus: Corpus, progress: bool = True) -> dict:
    """asr.train's closing real-speech line: the test split of `corpus` (e.g. asterisk, in its
    folder beside the training corpus: asr.data.corpus.corpus; prepared there on first use) scored with
    the model's greedy PER and, when the model has a lexicon and LM, lexicon + LM WER with the
    corpus's own lexicon.txt added to the model's (its words outside the LM get <unk>'s
    probability; the OOV rate against the LM says how many)."""
    from asr.model.decoding_files import model_decoding_files
    files = model_decoding_files(checkpoint)
    words = files.lexicon is not None and files.lm is not None
    config = EvaluateConfig(checkpoint=str(checkpoint), split="test",
                            data={"corpus": corpus.name, "root": str(corpus.root)},
                            decoder="lexicon" if words else "greedy", progress=progress)
    if words and (corpus.root / "lexicon.txt").is_file():
        config.extra_lexicon = str(corpus.root / "lexicon.txt")
    try:
        report = evaluate(config)
    except EvaluationError as error:
        # the training went well; a real-speech set that cannot be had (its Debian packages missing) is said, not fatal
        logging.getLogger("asr.evaluation").warning("no real-speech test (%s): %s", corpus.name, error)
        return {}
    rates = report["error_rates"]
    result = {"corpus": corpus.name, "per": rates.get("per"), "evaluation": report["out"]}
    if words:
        result.update(wer_lexicon=rates["wer_lexicon"], oov_lm=report["out_of_vocabulary"]["lm"])
    return result

"""Evaluate a checkpoint, with the attention it was trained with or any other one.

    python -m asr.evaluate checkpoint=runs/synth_iclustered/2026-11-22_05-25-00/checkpoints/best.ckpt
    python -m asr.evaluate checkpoint=best.ckpt attention=clustered attention.clusters=32
    python -m asr.evaluate checkpoint=best.ckpt attention=i-clustered-100 split=dev
    python -m asr.evaluate checkpoint=best.ckpt attention=lsh-4          # refused unless shared QK
    python -m asr.evaluate checkpoint=best.ckpt data_dir=my_audio/       # a Kaldi-style folder
    python -m asr.evaluate checkpoint=best.ckpt decoder=beam beam_size=16
    python -m asr.evaluate checkpoint=best.ckpt decoder=lexicon [lm_weight=1 word_score=0 beam=50]
    python -m asr.evaluate checkpoint=best.ckpt data_dir=my_audio/ decoder=lexicon lexicon=my.txt lm=my.arpa.gz
    python -m asr.evaluate checkpoint=best.ckpt data_dir=my_audio/ decoder=lexicon extra_lexicon=new_words.txt
    python -m asr.evaluate checkpoint=best.ckpt data_dir=my_audio/ reference_lexicon=cmudict.dict   # PER too

Arguments are key=value (see `EvaluateConfig` below, or `python -m asr.evaluate --help`):
`attention` is an attention spec (a registry name such as `iclustered`, or a short form such as
`i-clustered-100`, `lsh-4`, `oracle-top-16`); `attention.<option>=<value>` sets one option on top.
Data: by default the split of the corpus the model was trained on (the run folder's config.yaml
next to checkpoints/), `data.<key>=...` changes any data option (e.g. `data.root`; `data.corpus`
alone, another corpus than the model's, reads data/<corpus>; an evaluation never generates or
changes a corpus - a split the corpus does not have is an error naming its splits - except that the
asterisk real-speech set is prepared on first use into a folder that is new or empty), and
`data_dir=PATH` scores a Kaldi-style data directory (wav.scp, text, optional utt2spk) instead:
its audio is converted once into manifests and features under <data_dir>/asr_manifests (or
`data.root`), and its word transcripts score the chars / sentencepiece heads (a phone head
decodes, unscored).

decoder=lexicon decodes words through a pronunciation lexicon and a word n-gram LM
(asr.evaluation.decoding, flashlight-text) on the phone head (or the first word head without one): WER/CER
come from it, PER still from the phone head. Without lexicon= and lm= they are the model's
(asr.model.decoding_files.model_decoding_files: the run folder's decoding/, which asr.train fills
from the corpus, else the corpus folder of its config.yaml), whatever data is scored and from any
working folder. lexicon= needs lm= too (a path, or lm=none for the lexicon alone);
extra_lexicon=PATH adds entries on top of the lexicon and keeps the LM. Lexicon words the LM lacks
get its <unk> probability; the printed line and results.json give the share of reference words
the LM (and the lexicon) does not know.

PER references never depend on the decoding lexicon: a split's manifests carry phones, and
reference_lexicon=PATH turns the word transcripts of data sources without phones (data_dir) into
phone references (each word's first pronunciation; words missing from it are listed).

Writes to `out` (default: <run folder>/evaluations/<name>/, the name made of every option that
changes the numbers: split, attention and options, decoder, seed, device, limit, data source;
e.g. test_full_greedy_seed0_cpu):
    results.json        error rates per head, forward time per utterance and per frame, settings
    hypotheses.jsonl    per utterance: id, and per head the reference and the hypothesis
    hyp_<kind>.txt      per head, Kaldi style: <utterance-id> <hypothesis>

The attention runs with a fixed seed (`seed`), so clustered and LSH attention (random hashing)
give the same numbers on every run. A model whose query and key projections are separate cannot
run lsh or shared_full (they are defined for keys equal to the queries) and such a swap is
refused. On a shared-QK model, full, clustered, iclustered and oracle_top run by default in the key
form the model was trained with (`shared_qk_keys=trained`): after shared_full or lsh that is the
Reformer form, unit-normalised keys and no attention to self unless nothing else
(attention_ext.attentions.reformer_key_form; clustered and iclustered are then computed densely: their forward
time is not the kernels'); `shared_qk_keys=raw` gives them keys equal to the raw queries with self
allowed, the form every evaluation had before the key form was followed. results.json says which (`key_form`).
"""
from __future__ import annotations

import logging
import sys

from asr.config.command_line import key_value_config, run_key_value_command
from asr.evaluation.evaluation import USAGE_ERRORS, EvaluateConfig, check_decoding_options, evaluate
from asr.core.errors import EvaluationError
from asr.evaluation.attention_choice import KEY_FORMS
from asr.text.metrics import percent


# ---- arguments ------------------------------------------------------------------------------------
def parse_arguments(argv: list[str]) -> tuple[EvaluateConfig, dict[str, str]]:
    """key=value arguments -> (config, attention options given as attention.<option>=value)."""
    attention_options: dict[str, str] = {}
    dotlist = []
    for argument in argv:
        key, equals, value = argument.partition("=")
        if not equals:
            raise EvaluationError(f"argument {argument!r} is not key=value; e.g. checkpoint=PATH attention=full")
        if key.startswith("attention."):
            attention_options[key.removeprefix("attention.")] = value
        else:
            dotlist.append(argument)
    config = key_value_config(EvaluateConfig, dotlist, EvaluationError, also=", attention.<option>, data.<option>")
    if not config.checkpoint:
        raise EvaluationError("give the checkpoint to evaluate: checkpoint=PATH (a .ckpt file, e.g. "
                              "runs/<preset>/<time>/checkpoints/best.ckpt)")
    if config.limit is not None and config.limit < 1:
        raise EvaluationError(f"limit={config.limit} must be >= 1 batches")
    if config.lexicon is not None and config.decoder != "lexicon":
        raise EvaluationError(f"lexicon={config.lexicon} is the decoding lexicon of decoder=lexicon; phone "
                              f"references for word transcripts come from reference_lexicon={config.lexicon}")
    check_decoding_options(config)
    return config, attention_options


# ---- the command ------------------------------------------------------------------------------------
def main(argv: list[str] | None = None) -> int:
    return run_key_value_command("asr.evaluate", __doc__, _evaluate_and_print, argv, usage_errors=USAGE_ERRORS)


def _evaluate_and_print(argv: list[str]) -> None:
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    config, attention_options = parse_arguments(argv)
    report = evaluate(config, attention_options)
    rates = report["error_rates"]
    attention = report["evaluated_with"]
    print(f"{report['checkpoint']}: {report['utterances']} utterances of {report['data']}")
    options = ", ".join(f"{key}={value}" for key, value in attention.items() if key != "name")
    print(f"attention {attention['name']}{f' ({options})' if options else ''}"
          f"{', as trained' if report['same_as_training'] else ''}; {report['decoder']} decoding")
    if report["key_form"] != "separate":
        print(f"keys: {KEY_FORMS[report['key_form']]} (shared_qk_keys={report['shared_qk_keys']})")
    if report["lexicon_decoder"]:
        settings = report["lexicon_decoder"]
        extra = f" + {settings['extra_lexicon']}" if settings["extra_lexicon"] else ""
        outside = (f", {settings['lexicon_words_outside_lm']} with the LM's <unk> probability"
                   if settings["lexicon_words_outside_lm"] else "")
        print(f"lexicon {settings['lexicon']}{extra} ({settings['lexicon_words']} words{outside}), "
              f"LM {settings['lm']}, lm_weight {settings['lm_weight']}, word_score {settings['word_score']}, "
              f"beam {settings['beam']} on the {settings['head']} head")
    words = ""   # decoder=lexicon: WER and CER are of its words, PER of the greedy phone head
    if report["lexicon_decoder"]:
        words = "lexicon + LM: " if report["lexicon_decoder"]["lm"] else "lexicon: "
    print(f"PER {percent(rates.get('per'))}  {words}WER {percent(rates.get('wer'))}  CER {percent(rates.get('cer'))}"
          + out_of_vocabulary_text(report))
    print(f"forward: {report['forward_ms_per_utterance']:.1f} ms per utterance, "
          f"{report['forward_us_per_frame']:.1f} us per 10 ms frame (real-time factor "
          f"{report['real_time_factor']:.3f}) on {report['device']} with {report['threads']} threads")
    print(f"decoding took {report['decode_seconds']:.1f} s in all")
    print(f"wrote {report['out']}/results.json and hypotheses.jsonl")


def out_of_vocabulary_text(report: dict) -> str:
    """decoder=lexicon: '  OOV 2.10% (reference words not in the LM; 0.50% not in the lexicon)'."""
    oov = report["out_of_vocabulary"]
    if not oov:
        return ""
    if report["lexicon_decoder"]["lm"] is None:
        return f"  OOV {percent(oov['lexicon'])} (reference words not in the lexicon; no LM)"
    return f"  OOV {percent(oov['lm'])} (reference words not in the LM; {percent(oov['lexicon'])} not in the lexicon)"


if __name__ == "__main__":
    sys.exit(main())

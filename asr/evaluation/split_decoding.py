"""One pass over a split: the model's forward, greedy / beam / lexicon + LM decoding, error rates
per head, and the forward time."""
from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from typing import Optional

import torch

from asr.core.errors import EvaluationError
from asr.data.batching.dataset import batch_references
from asr.evaluation.evaluation_data import EvaluationData
from asr.model.ctc import decode_transcripts
from asr.model.evaluation_tally import EvaluationTally
from asr.model.recognizer import EVALUATION_SEED, SpeechRecognizer, seed_evaluation_batch

log = logging.getLogger("asr.evaluate")


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


def _utterance_records(ids: list[str], hypotheses: dict, references: dict) -> list[dict]:
    """One record per utterance: its id, and per head its hypothesis (and reference where scored)."""
    return [{"id": utterance_id, **{
        kind: {"hypothesis": hypotheses[kind][i], **({"reference": references[kind][i]} if kind in references else {})}
        for kind in hypotheses}} for i, utterance_id in enumerate(ids)]


def _warn_of_missing_words(missing_words: dict[str, int]) -> None:
    if missing_words:
        shown = ", ".join(sorted(missing_words, key=missing_words.get, reverse=True)[:10])
        log.warning("%d words of the transcripts are not in the reference lexicon (phone references lack "
                    "them): %s", len(missing_words), shown)


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
        batch_records = _utterance_records(batch["ids"], hypotheses, references)
        if word_decoder is not None:   # its workers decode the words while the model computes the next batch
            head, parallel = word_decoder
            rows = log_probs[head].cpu().numpy()
            pending += [(record, batch["texts"][i], parallel.submit(rows[i, :int(out_lengths[i])]))
                        for i, record in enumerate(batch_records)]
        records.extend(batch_records)
    bar.close()
    if not records:
        raise EvaluationError(f"split {data.split!r} of {data.source} has no utterances")
    scored_tokenizers = {kind: model.tokenizers[kind] for kind in tally.references}
    rates = tally.error_rates(scored_tokenizers)
    out_of_vocabulary = None
    if pending:
        out_of_vocabulary = _collect_lexicon_words(pending, rates, word_decoder[1], progress)
    _warn_of_missing_words(missing_words)
    audio_seconds = input_frames * 0.01          # 10 ms frame shift
    return EvaluationResult(rates, records, forward_seconds, input_frames, tally.encoder_frames, audio_seconds,
                            time.perf_counter() - started, sorted(missing_words), out_of_vocabulary)

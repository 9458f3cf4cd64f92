"""What a validation or test pass collects, batch by batch, and the error rates it gives: the one
tally of asr.train's validation and test passes (SpeechRecognizer) and of asr.evaluate.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch

from asr.data.splits.tokenizers import Tokenizer
from asr.text.metrics import char_error_rate, phone_error_rate, word_error_rate


@dataclass
class EvaluationTally:
    """What a validation or test pass collects: transcripts per head, encoder frames, summed loss
    (each utterance's weighted CTC loss; per head in head_loss_sums), and in asr.train's test pass
    the words the lexicon + LM decoder made of the same log-probabilities (word_references and
    word_hypotheses, see SpeechRecognizer.test_word_decoding)."""
    references: dict[str, list[str]] = field(default_factory=dict)
    hypotheses: dict[str, list[str]] = field(default_factory=dict)
    word_references: list[str] = field(default_factory=list)
    word_hypotheses: list[str] = field(default_factory=list)
    encoder_frames: int = 0
    utterances: int = 0
    loss_sum: float = 0.0
    head_loss_sums: dict[str, float] = field(default_factory=dict)

    def add(self, hypotheses: dict[str, list[str]], references: dict[str, list[str]],
            encoder_lengths: torch.Tensor) -> None:
        """Counts one batch: per scored head its references and hypotheses, and the encoder lengths
        (the one tally of validation, test and asr.evaluate)."""
        for kind, strings in references.items():
            self.references.setdefault(kind, []).extend(strings)
            self.hypotheses.setdefault(kind, []).extend(hypotheses[kind])
        self.encoder_frames += int(encoder_lengths.sum())
        self.utterances += len(encoder_lengths)

    def error_rates(self, tokenizers: dict[str, Tokenizer]) -> dict[str, float]:
        """PER/WER/CER per head and headline, the primary error and the mean encoder length.

        Per head: `per_phones`, `wer_chars`, `cer_chars`, ... The headline names `per`, `wer`,
        `cer` come from the phone head and the first word-level head; `primary_error` is the
        first target kind's PER (phones) or WER (chars, sentencepiece). With lexicon + LM words:
        `wer_lexicon`, `cer_lexicon`.
        """
        rates: dict[str, float] = {}
        for kind in self.references:
            references, hypotheses = self.references[kind], self.hypotheses[kind]
            if tokenizers[kind].field == "phones":
                # TIMIT's 61 phones are scored folded to 39 classes (asr.text.metrics.phone_error_rate)
                phone_set = getattr(tokenizers[kind], "phone_set", None) or "arpabet39"
                rates[f"per_{kind}"] = phone_error_rate(references, hypotheses, phone_set)
                rates.setdefault("per", rates[f"per_{kind}"])
            else:
                rates[f"wer_{kind}"] = word_error_rate(references, hypotheses)
                rates[f"cer_{kind}"] = char_error_rate(references, hypotheses)
                rates.setdefault("wer", rates[f"wer_{kind}"])
                rates.setdefault("cer", rates[f"cer_{kind}"])
        if self.references:
            primary = next(iter(tokenizers))
            rates["primary_error"] = rates[f"per_{primary}" if f"per_{primary}" in rates else f"wer_{primary}"]
        if self.word_references:
            rates["wer_lexicon"] = word_error_rate(self.word_references, self.word_hypotheses)
            rates["cer_lexicon"] = char_error_rate(self.word_references, self.word_hypotheses)
        if self.utterances:
            rates["encoder_length"] = self.encoder_frames / self.utterances
        return rates

"""What asr.train, asr.evaluate, asr.transcribe, asr.tune_lm and asr.cross_matrix share for lexicon
decoding: resolving the lexicon options, picking the head to
decode, and scoring the words."""
from __future__ import annotations

import logging

from asr.model.decoding_files import LM_FILE, DecodingFiles
from asr.evaluation.decoding.lexicon import LexiconFileError
from asr.evaluation.decoding.lexicon_decoder import LexiconDecoderSettings, ParallelLexiconDecoder

NO_LM = ("none", "")

log = logging.getLogger("asr.decoding")


# ---- the lexicon options of a command ---------------------------------------------------------------
def _option(name: str, value: str, dashes: bool) -> str:
    return f"--{name.replace('_', '-')} {value}" if dashes else f"{name}={value}"


def check_lexicon_options(decoder: str, lexicon: str | None, lm: str | None, extra_lexicon: str | None = None,
                          dashes: bool = False) -> None:
    """LexiconFileError (a usage error) for lexicon options that cannot mean what they say: any of
    them without decoder=lexicon, or a lexicon without an LM choice. `dashes`: the command spells
    its options --lexicon (asr.cross_matrix) rather than lexicon=."""
    given = [name for name, value in (("lexicon", lexicon), ("lm", lm), ("extra_lexicon", extra_lexicon))
             if value is not None]
    if decoder != "lexicon" and given:
        raise LexiconFileError(
            f"{', '.join(_option(name, '...', dashes) for name in given)} only work with "
            f"{_option('decoder', 'lexicon', dashes)}")
    if lexicon is not None and lm is None:
        raise LexiconFileError(
            f"{_option('lexicon', lexicon, dashes)} is given without an LM: give {_option('lm', 'PATH', dashes)} "
            f"(an ARPA LM over its words, e.g. from `python -m asr.build_lm TEXT --lexicon {lexicon} --out "
            f"lm.arpa.gz`), or {_option('lm', 'none', dashes)} to decode with the lexicon alone; to add words "
            f"to the model's lexicon and keep its LM, give {_option('extra_lexicon', 'PATH', dashes)} instead")


def resolve_settings(lexicon: str | None, lm: str | None, defaults: DecodingFiles, extra_lexicon: str | None = None,
                     dashes: bool = False, **options) -> LexiconDecoderSettings:
    """Decoder settings from a command's options, the model's files (`defaults`) filling in what
    is not given. LexiconFileError when no lexicon is given or found, when a lexicon comes
    without an LM choice (check_lexicon_options), or when the model's lexicon has no LM beside it
    and none is given. lm='none' decodes with the lexicon only."""
    check_lexicon_options("lexicon", lexicon, lm, extra_lexicon, dashes)
    if lexicon is None:
        if defaults.lexicon is None:
            raise LexiconFileError(
                f"decoder=lexicon needs a lexicon, and this model has none (looked in {defaults.where_searched()}): "
                f"give {_option('lexicon', 'PATH', dashes)} and {_option('lm', 'PATH|none', dashes)}")
        lexicon = str(defaults.lexicon)
        if lm is None:
            if defaults.lm is None:
                raise LexiconFileError(
                    f"the model's lexicon {defaults.lexicon} has no LM beside it ({LM_FILE}): give "
                    f"{_option('lm', 'PATH', dashes)}, or {_option('lm', 'none', dashes)} to decode with the "
                    f"lexicon alone")
            lm = str(defaults.lm)
    return LexiconDecoderSettings(lexicon=str(lexicon), lm=None if lm in NO_LM else str(lm),
                                  extra_lexicon=extra_lexicon, **options)


def settings_from_command(config, defaults: DecodingFiles) -> LexiconDecoderSettings:
    """resolve_settings from a command's config (asr.evaluate's or asr.transcribe's), which both carry
    the options lexicon, lm, extra_lexicon, lm_weight, word_score, beam and restrict_lexicon."""
    return resolve_settings(config.lexicon, config.lm, defaults, config.extra_lexicon, lm_weight=config.lm_weight,
                            word_score=config.word_score, beam=config.beam, restrict_lexicon=config.restrict_lexicon)


def word_head(tokenizers: dict) -> str:
    """The head the lexicon decoder reads: the phone head if there is one, else the first word head."""
    for kind, tokenizer in tokenizers.items():
        if tokenizer.kind == "phones":
            return kind
    return next(iter(tokenizers))


def start_word_decoder(tokenizers: dict, settings: LexiconDecoderSettings,
                       workers: int | None = None) -> tuple[str, ParallelLexiconDecoder]:
    """(the decoded head, a parallel decoder over it): every input is checked here, before decoding."""
    kind = word_head(tokenizers)
    return kind, ParallelLexiconDecoder(tokenizers[kind], settings, workers)


class BatchWordDecoding:
    """Lexicon + LM decoding of log-probabilities another pass computes: asr.train's test pass hands
    it each test batch's (SpeechRecognizer.test_word_decoding), so the test split is decoded once for
    the greedy rates and the words. The workers decode while the model computes the next batch."""

    def __init__(self, tokenizers: dict, settings: LexiconDecoderSettings, workers: int | None = None):
        self.head, self.decoder = start_word_decoder(tokenizers, settings, workers)
        self._pending: list = []   # (reference words, the worker's result)

    def submit(self, log_probs: dict, lengths, references: list[str]) -> None:
        """One batch: {head: (B, T, V) log-probs}, (B,) valid lengths, the B reference transcripts."""
        rows = log_probs[self.head].detach().float().cpu().numpy()
        for index, reference in enumerate(references):
            self._pending.append((reference, self.decoder.submit(rows[index, :int(lengths[index])])))

    def words(self) -> tuple[list[str], list[str]]:
        """(references, hypotheses) of every utterance submitted since the last call, in order."""
        pending, self._pending = self._pending, []
        return [reference for reference, _ in pending], [result.get() for _, result in pending]

    def close(self) -> None:
        self.decoder.close()


def word_rates(references: list[str], hypotheses: list[str]) -> dict[str, float]:
    from asr.text.metrics import char_error_rate, word_error_rate
    return {"wer_lexicon": word_error_rate(references, hypotheses),
            "cer_lexicon": char_error_rate(references, hypotheses)}


def out_of_vocabulary_report(references: list[str], decoder, shown: int = 20) -> dict:
    """How much of the reference text the decoder cannot get right from its vocabulary: the share
    of reference word tokens the LM does not know (None without an LM) and the share the lexicon
    cannot spell (never decodable), each with its most frequent words."""
    from collections import Counter
    from asr.text.metrics import out_of_vocabulary_rate
    tokens = Counter(word for reference in references for word in reference.split())

    def outside(vocabulary) -> list[str]:
        return [word for word, _ in tokens.most_common() if word not in vocabulary][:shown]

    lm = decoder.lm_vocabulary
    return {"reference_words": sum(tokens.values()),
            "lm": None if lm is None else out_of_vocabulary_rate(references, lm),
            "lexicon": out_of_vocabulary_rate(references, decoder.lexicon_words),
            "words_outside_lm": [] if lm is None else outside(lm),
            "words_outside_lexicon": outside(decoder.lexicon_words)}

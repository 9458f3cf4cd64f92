"""What asr.evaluate, asr.transcribe, asr.tune_lm and asr.cross_matrix share for lexicon decoding:
finding the corpus's lexicon and LM, picking the head to decode, and scoring the words."""
from __future__ import annotations

from pathlib import Path
from typing import Optional

from asr.decoding.lexicon import LexiconFileError
from asr.decoding.lexicon_decoder import LexiconDecoderSettings, ParallelLexiconDecoder

LEXICON_FILE, LM_FILE = "lexicon.txt", "lm/3gram.arpa.gz"


def corpus_lexicon_and_lm(data_root: str | Path | None) -> tuple[Optional[Path], Optional[Path]]:
    """The lexicon and LM a corpus folder ships (recipes write them there), or None for each missing."""
    if not data_root:
        return None, None
    root = Path(data_root)
    lexicon, lm = root / LEXICON_FILE, root / LM_FILE
    return (lexicon if lexicon.is_file() else None), (lm if lm.is_file() else None)


def word_head(tokenizers: dict) -> str:
    """The head the lexicon decoder reads: the phone head if there is one, else the first word head."""
    for kind, tokenizer in tokenizers.items():
        if tokenizer.kind == "phones":
            return kind
    return next(iter(tokenizers))


def resolve_settings(lexicon: str | None, lm: str | None, data_root: str | Path | None,
                     **options) -> LexiconDecoderSettings:
    """Decoder settings with lexicon/LM defaulting to the corpus folder's; LexiconFileError when
    no lexicon is given or found. lm='none' decodes with the lexicon only."""
    found_lexicon, found_lm = corpus_lexicon_and_lm(data_root)
    lexicon = lexicon or (str(found_lexicon) if found_lexicon else None)
    if lexicon is None:
        raise LexiconFileError(f"decoder=lexicon needs a lexicon: give lexicon=PATH (none found at "
                               f"{Path(data_root or '.') / LEXICON_FILE})")
    if lm is None and found_lm is not None:
        lm = str(found_lm)
    if lm in ("none", ""):
        lm = None
    return LexiconDecoderSettings(lexicon=str(lexicon), lm=lm, **options)


def settings_from_command(config, data_root: str | Path | None) -> LexiconDecoderSettings:
    """resolve_settings from a command's config (asr.evaluate's or asr.transcribe's), which both carry
    the options lexicon, lm, lm_weight, word_score, beam and restrict_lexicon."""
    return resolve_settings(config.lexicon, config.lm, data_root, lm_weight=config.lm_weight,
                            word_score=config.word_score, beam=config.beam,
                            restrict_lexicon=config.restrict_lexicon)


def start_word_decoder(tokenizers: dict, settings: LexiconDecoderSettings,
                       workers: int | None = None) -> tuple[str, ParallelLexiconDecoder]:
    """(the decoded head, a parallel decoder over it): every input is checked here, before decoding."""
    kind = word_head(tokenizers)
    return kind, ParallelLexiconDecoder(tokenizers[kind], settings, workers)


def word_rates(references: list[str], hypotheses: list[str]) -> dict[str, float]:
    from asr.metrics import char_error_rate, word_error_rate
    return {"wer_lexicon": word_error_rate(references, hypotheses),
            "cer_lexicon": char_error_rate(references, hypotheses)}

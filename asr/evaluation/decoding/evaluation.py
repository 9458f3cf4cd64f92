"""What asr.train, asr.evaluate, asr.transcribe, asr.tune_lm and asr.cross_matrix share for lexicon
decoding: finding a model's lexicon and LM, resolving the lexicon options, picking the head to
decode, and scoring the words.

Where a model's lexicon and LM come from (`model_decoding_files`), decided so that every command
finds the same files from any working folder, also after the run folder was moved:

1. `<run folder>/decoding/lexicon.txt` and `<run folder>/decoding/lm/3gram.arpa.gz`: asr.train
   copies the corpus's two files there when a run starts (`keep_decoding_files_in_run`), so the
   run folder carries the lexicon and LM its model was tested with, wherever it goes and whatever
   later happens to the corpus folder (a copy, not a link: an edit of the corpus's lexicon in place
   must not change what a finished run decodes with; the synth corpus's pair is 1.7 MB).
2. For run folders made before that: the corpus folder of the run's `config.yaml` (`data.root`),
   which asr.train stored as given, usually relative to the folder training ran in. It is
   tried as an absolute path, relative to the folder Hydra recorded as the working folder of the
   run (`.hydra/hydra.yaml`, `hydra.runtime.cwd`), relative to each folder above the run folder
   (a repository with `runs/<preset>/<time>` and `data/<corpus>`, moved as a whole), and
   relative to the current working folder, in that order.

The data a command scores (`data_dir=`, `data.root=`) never changes where they come from: they
are the model's. An explicit `lexicon=` needs an explicit `lm=` (a path, or `none`): a lexicon of
other words with the model's LM, or silently with no LM, is what a user rarely means.
"""
from __future__ import annotations

import logging
import os
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

from asr.data.manifests import corpus_root
from asr.model.run_folder import run_folder_of, stored_data_config
from asr.evaluation.decoding.lexicon import LexiconFileError
from asr.evaluation.decoding.lexicon_decoder import LexiconDecoderSettings, ParallelLexiconDecoder

LEXICON_FILE, LM_FILE = "lexicon.txt", "lm/3gram.arpa.gz"
RUN_DECODING_FOLDER = "decoding"      # <run folder>/decoding/{lexicon.txt, lm/3gram.arpa.gz}
NO_LM = ("none", "")

log = logging.getLogger("asr.evaluation.decoding")


@dataclass
class DecodingFiles:
    """A model's (or a corpus folder's) lexicon and LM, None where missing, and every folder
    searched for them (for the message when they are needed and missing)."""
    lexicon: Optional[Path] = None
    lm: Optional[Path] = None
    searched: list[Path] = field(default_factory=list)

    def where_searched(self) -> str:
        return ", ".join(str(folder) for folder in self.searched) or "nowhere (no run folder, no corpus folder)"


def corpus_decoding_files(folder: str | Path | None) -> DecodingFiles:
    """The lexicon and LM a corpus folder (or a run's decoding/ folder) holds, None for each missing."""
    if not folder:
        return DecodingFiles()
    folder = Path(folder)
    lexicon, lm = folder / LEXICON_FILE, folder / LM_FILE
    return DecodingFiles(lexicon if lexicon.is_file() else None, lm if lm.is_file() else None, [folder])


def _stored_corpus_folders(run: Path) -> list[Path]:
    """Where the corpus folder of an older run folder may be: its config.yaml's data.root as an
    absolute path, relative to Hydra's recorded working folder, to each folder above the run
    folder, and to the current working folder (see the module docstring)."""
    import yaml
    try:
        root = stored_data_config(run).get("root")
    except (OSError, yaml.YAMLError):
        return []
    if not root:
        return []
    root = corpus_root(root)
    if root.is_absolute():
        return [root]
    bases: list[Path] = []
    try:
        hydra = yaml.safe_load((run / ".hydra" / "hydra.yaml").read_text()) or {}
        cwd = ((hydra.get("hydra") or {}).get("runtime") or {}).get("cwd")
        if cwd:
            bases.append(Path(cwd))
    except (OSError, yaml.YAMLError):
        pass
    bases.extend(run.parents)
    bases.append(Path.cwd())
    return list(dict.fromkeys(Path(os.path.abspath(base / root)) for base in bases))   # symlinks kept as named


def model_decoding_files(checkpoint: str | Path) -> DecodingFiles:
    """The lexicon and LM of the model in `checkpoint`: its run folder's decoding/ folder, else
    the first corpus folder found from the run's stored data.root that holds a lexicon (with
    the LM beside it, or None); never mixes a lexicon of one folder with an LM of another."""
    run = run_folder_of(checkpoint)
    if run is None:
        return DecodingFiles()
    searched: list[Path] = []
    for folder in [run / RUN_DECODING_FOLDER, *_stored_corpus_folders(run)]:
        searched.append(folder)
        found = corpus_decoding_files(folder)
        if found.lexicon is not None:
            return DecodingFiles(found.lexicon, found.lm, searched)
    return DecodingFiles(searched=searched)


def keep_decoding_files_in_run(run_dir: str | Path, data_root: str | Path) -> DecodingFiles:
    """Copies the corpus folder's lexicon and LM into <run_dir>/decoding/ (each under a temporary
    name, then renamed), unless the run folder has them already (a resumed run keeps what it
    started with). Returns what the run folder holds now."""
    target = Path(run_dir) / RUN_DECODING_FOLDER
    source = corpus_decoding_files(data_root)
    for name, path in ((LEXICON_FILE, source.lexicon), (LM_FILE, source.lm)):
        destination = target / name
        if path is None or destination.is_file():
            continue
        destination.parent.mkdir(parents=True, exist_ok=True)
        partial = destination.with_name(destination.name + ".partial")
        shutil.copyfile(path, partial)
        os.replace(partial, destination)
        log.info("decoding: %s -> %s", path, destination)
    return corpus_decoding_files(target)


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

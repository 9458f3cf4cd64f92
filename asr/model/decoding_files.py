"""The lexicon and LM that belong to a trained model: its run folder's decoding/ copy, or the corpus
folder its config names.

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

from asr.data.corpus.manifests import corpus_root
from asr.model.run_folder import run_folder_of, stored_data_config

LEXICON_FILE, LM_FILE = "lexicon.txt", "lm/3gram.arpa.gz"
RUN_DECODING_FOLDER = "decoding"      # <run folder>/decoding/{lexicon.txt, lm/3gram.arpa.gz}

log = logging.getLogger("asr.decoding")


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

"""A corpus on disk: the recipes that prepare one, the lhotse manifests they write and how they are
read, the corpus a config names, and the formats recipes read and write (Kaldi folders, long
recordings). Imports asr.data.audio only.

Import order (each module imports only those above it, and asr.data.audio):

    corpus_recipes                  the entry point through which asr reaches a recipe
    manifests                       reading and checking a recipe's cut manifests
    corpus, preparation_report      the corpus a config names; a preparation's report
    corpus_summary                  a corpus in a few console lines (corpus)
    manifest_builder                recordings and utterances -> manifests (manifests, preparation_report)
    kaldi_dir, long_recordings      Kaldi data folders (audio); long test recordings' layout
"""
from . import corpus_recipes
from . import manifests
from . import corpus
from . import preparation_report
from . import corpus_summary
from . import manifest_builder
from . import kaldi_dir
from . import long_recordings

"""What a split's utterances must pass before they are batched: usable audio and transcripts, and
targets the tokenizers can encode. Imports asr.data.corpus and asr.data.features.

Import order (each module imports only those above it):

    tokenizers        phones, characters, sentencepiece: text -> CTC targets
    cut_checks        which utterances a split keeps, and why the others are left out
"""
from . import tokenizers
from . import cut_checks

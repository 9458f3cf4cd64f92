"""The streaming data path for large corpora: a split's shards, written once and read window by
window. Imports asr.data.audio, corpus, features, augment and splits.

Import order (each module imports only those above it):

    stream_shards         the shards' layout, the index and the features read from them
    stream_preparation    writing a split's shards, resumable (stream_shards)
    streamed_split        a streamed split's tokenizers and checks, from its index (stream_preparation)
"""
from . import stream_shards
from . import stream_preparation
from . import streamed_split

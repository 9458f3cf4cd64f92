"""From checked utterances to batches: the samplers that choose them (eager and streamed), long
examples joined from utterances, and the dataset that pads them into tensors. Imports every
other room of asr.data.

Import order (each module imports only those above it):

    duration_buckets, joined_examples     lhotse's duration buckets with a hard cap; joined examples
    stream_sampler                        buckets over windows of shards (duration_buckets)
    dataset                               cuts -> a padded `Batch` (duration_buckets, joined_examples)
"""
from . import duration_buckets
from . import joined_examples
from . import stream_sampler
from . import dataset

"""Filter-bank features: the computation, the cache on disk and the training set's statistics.
Imports asr.data.audio only (commands announced when a cached feature's audio comes from one).

Import order (each module imports only those above it):

    features          Kaldi-compatible log-mel filter banks
    feature_cache     the features on disk, computed once (features)
    feature_stats     the global mean/std over the training frames (feature_cache, features)
"""
from . import features
from . import feature_cache
from . import feature_stats

"""The corpus and its batches, in rooms: each imports only the rooms above it here (tests/test_layers.py
holds them to it), and each folder's `__init__.py` lists its modules in their import order.

    audio/        where a recording's samples come from (files, SPHERE, shell commands)
    corpus/       recipes' entry point, manifests and their builder, the corpus a config names  (audio)
    features/     filter banks, their cache on disk and statistics                             (audio)
    augment/      SpecAugment, waveform transforms, speaker changes, VTLP          (audio, corpus, features)
    splits/       tokenizers, and which utterances a split keeps                          (corpus, features)
    streaming/    the streaming path's shards, written once                            (the rooms above)
    batching/     samplers, joined examples, the dataset of padded batches             (the rooms above)
    config.py     the `data:` section, valid by construction                           (the rooms above)
    datamodule.py the Lightning DataModule, from a DataConfig and its corpus           (the rooms above)

Nothing is imported here, so that a recipe importing asr.data.corpus does not load Lightning.
"""

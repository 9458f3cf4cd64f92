"""Augmentation of training utterances: SpecAugment on features, vocal tract length perturbation,
speaker changes and lhotse's waveform transforms (`data.augment`). Imports asr.data.audio,
asr.data.corpus and asr.data.features.

Import order (each module imports only those above it):

    specaugment, speaker_change, vtlp     feature masks; Praat's change of speaker; mel-axis warps
    waveform_augmentation                 speed, rooms, noise, channel, level (speaker_change)
"""
from . import specaugment
from . import speaker_change
from . import vtlp
from . import waveform_augmentation

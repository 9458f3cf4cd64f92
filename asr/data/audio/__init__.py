"""Where a recording's samples come from: SPHERE files, shell commands (allowed or refused), and the
one reader of either. Imports nothing else of asr.data.

Import order (each module imports only those above it):

    sphere, command_sources     NIST SPHERE decoding; audio written by shell commands
    audio_source                a file or a Kaldi pipe -> int16 samples (sphere, command_sources)
"""
from . import sphere
from . import command_sources
from . import audio_source

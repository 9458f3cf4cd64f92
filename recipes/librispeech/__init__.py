"""LibriSpeech (OpenSLR 12): manifests with word targets (optionally phones); see README.md."""

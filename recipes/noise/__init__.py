"""MUSAN and OpenSLR 28 room responses and noises, for augmentation: README.md."""

"""Debian's Asterisk voice prompts (one human voice): a real-speech dev/test set with ARPABET_39
phone references from espeak-ng; see README.md."""

"""The CTC transformer encoder and its training module."""

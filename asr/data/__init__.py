"""Manifests, features, tokenizers, batching and augmentation."""

"""Corpus recipes: one package per corpus, each turning the corpus on disk into lhotse manifests."""

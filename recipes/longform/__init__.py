"""Long test recordings (1 to 60 minutes) joined from a corpus split's utterances, for the long-form
benchmark (asr.benchmarks.longform): README.md. Not a corpus recipe (no RECIPE): it reads another
corpus's manifests."""

"""asr's measurement tools over the application: scripts that run a model or its pieces and print
tables (and write CSV and plots), never timed tests. `python -m asr.benchmarks.longform`: transcribing
long recordings per attention and mode (asr/docs/evaluation.md, "The long-form benchmark")."""

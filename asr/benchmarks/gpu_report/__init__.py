"""The GPU report (`python -m asr.benchmarks.gpu_report`): every measurement and check still owed on
a CUDA machine, resumable part by part, as one Markdown report with the raw CSVs (__main__.py)."""

"""The GPU report (`python -m attention_ext.gpu_report`): every measurement and check still owed on
a CUDA machine, resumable part by part, as one Markdown report with the raw CSVs (__main__.py)."""

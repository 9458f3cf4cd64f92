"""The training-step benchmark (`python -m asr.benchmarks.step`): the toolkit's CTC model with each
attention against the same model written plainly in PyTorch (plain_model.py), on the same batches
(workloads.py); `--breakdown` says where one step's time goes (breakdown.py)."""

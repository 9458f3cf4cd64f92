"""attention_ext's tools: commands that measure the library alone and print tables (and write CSV
and plots), never imported by `import attention_ext` and needing the `benchmarks` extra (matplotlib,
tqdm) beside torch.

    python -m attention_ext.benchmarks.speed              time and memory per attention and length
    python -m attention_ext.benchmarks.clustered_profile  where clustered attention's time goes
    python -m attention_ext.benchmarks.copy_task          the masked copy task (training, accuracy)
"""

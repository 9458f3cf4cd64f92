"""asr: CTC speech recognition on filter-bank features with attention from attention_ext.

Data flows recipe -> manifest -> features -> batches -> model -> CTC -> decode -> metrics.
"""

"""asr's measurement tools: scripts that run the model or the data path and print tables (and write
CSV and plots), never timed tests. They sit at asr's top, beside the commands: they may import any
layer of asr, and nothing outside a benchmarks folder imports them (tests/test_layers.py).

    python -m asr.benchmarks.step [--breakdown]       seconds per training step against the same model
                                                      written plainly in PyTorch (step/; its results:
                                                      asr/benchmarks/step/RESULTS.md)
    python -m asr.benchmarks.data --root DIR          feature extraction and batching speed on a
                                                      prepared corpus (data.py)
    python -m asr.benchmarks.scale                    start-up, memory, feature cache and batch rate of
                                                      the training data path from 10 h up (scale.py, on
                                                      corpora that scaled_corpus.py makes from a small one)
    python -m asr.benchmarks.decoding checkpoint=P    greedy, prefix beam, lexicon and lexicon + LM
                                                      decoding side by side: WER and time (decoding.py)
    python -m asr.benchmarks.longform checkpoint=P    long recordings per attention and mode (longform.py;
                                                      each row in a child process, longform_measurement.py)

`--help` lists a benchmark's options; the measurements are in asr/RESULTS.md and
asr/benchmarks/step/RESULTS.md.
"""

"""Word decoding of CTC output: pronunciation lexicons, n-gram LMs, and the lexicon decoder."""

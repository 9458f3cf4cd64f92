"""WSJ (LDC93S6B + LDC94S13B): manifests with CMUdict phone targets and words; see README.md."""

"""TIMIT (LDC93S1): manifests with 61-phone targets (scored folded to 39); see README.md."""

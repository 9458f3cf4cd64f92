"""Switchboard-1 (LDC97S62) + ms98 transcripts: manifests of conversation-side segments; see README.md."""

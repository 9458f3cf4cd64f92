"""One check of the GPU report: what was checked, whether it held, and what was seen. Every part's
reader returns a list of them (parts.py, training_steps.py) and the report prints them (report.py)."""
from __future__ import annotations

from dataclasses import dataclass


@dataclass
class Check:
    what: str
    ok: bool
    detail: str = ""

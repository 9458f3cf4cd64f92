"""The phone sets of phone targets and PER, registered in one place (PHONE_SETS): CMUdict's 39
ARPAbet phones without stress (the default), and TIMIT's 61 symbols scored on Lee & Hon's 39
classes. A corpus names its set in its manifests (`custom["phone_set"]`); a corpus with a new
phone set adds one PhoneSet entry here and nothing else in asr/.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Optional

ARPABET_39 = (
    "AA", "AE", "AH", "AO", "AW", "AY", "B", "CH", "D", "DH", "EH", "ER", "EY", "F", "G",
    "HH", "IH", "IY", "JH", "K", "L", "M", "N", "NG", "OW", "OY", "P", "R", "S", "SH",
    "T", "TH", "UH", "UW", "V", "W", "Y", "Z", "ZH",
)


def strip_stress(phone: str) -> str:
    """'AH0' -> 'AH': CMUdict marks vowel stress with a trailing digit."""
    return phone.rstrip("012")


# TIMIT transcribes with 61 phone symbols (its .PHN files, written here in uppercase); models are
# trained on them, and PER is scored after folding both sides to the 39 classes of Lee & Hon (1989),
# "Speaker-independent phone recognition using hidden Markov models", table: closures, pauses and
# h# become SIL, Q (glottal stop) is deleted, and AO->AA, AX/AX-H->AH, AXR->ER, EL->L, EM->M,
# EN/NX->N, ENG->NG, HV->HH, IX->IH, UX->UW, ZH->SH. Note the 39 classes are not ARPABET_39: they
# keep DX and SIL and have no AO or ZH.
TIMIT_61 = (
    "AA", "AE", "AH", "AO", "AW", "AX", "AX-H", "AXR", "AY", "B", "BCL", "CH", "D", "DCL", "DH",
    "DX", "EH", "EL", "EM", "EN", "ENG", "EPI", "ER", "EY", "F", "G", "GCL", "H#", "HH", "HV", "IH",
    "IX", "IY", "JH", "K", "KCL", "L", "M", "N", "NG", "NX", "OW", "OY", "P", "PAU", "PCL", "Q", "R",
    "S", "SH", "T", "TCL", "TH", "UH", "UW", "UX", "V", "W", "Y", "Z", "ZH",
)
TIMIT_61_TO_39 = {phone: phone for phone in TIMIT_61} | {
    "AO": "AA", "AX": "AH", "AX-H": "AH", "AXR": "ER", "EL": "L", "EM": "M", "EN": "N", "NX": "N",
    "ENG": "NG", "HV": "HH", "IX": "IH", "UX": "UW", "ZH": "SH",
    "BCL": "SIL", "DCL": "SIL", "GCL": "SIL", "PCL": "SIL", "TCL": "SIL", "KCL": "SIL",
    "H#": "SIL", "PAU": "SIL", "EPI": "SIL", "Q": None,
}


def fold_timit_61_to_39(phones: str) -> str:
    """'H# SH IX HV EH DCL ...' -> 'SIL SH IH HH EH SIL ...' (Lee & Hon); Q is dropped.

    Consecutive SILs are kept as they are: folding is per symbol, as in the standard scoring.
    """
    folded = []
    for phone in phones.split():
        if phone not in TIMIT_61_TO_39:
            raise ValueError(f"{phone!r} is not a TIMIT phone (asr.text.phones.TIMIT_61)")
        if TIMIT_61_TO_39[phone] is not None:
            folded.append(TIMIT_61_TO_39[phone])
    return " ".join(folded)


@dataclass(frozen=True)
class PhoneSet:
    symbols: tuple[str, ...]                             # the inventory, in the tokenizer's order
    scoring_fold: Optional[Callable[[str], str]] = None  # applied to both sides before PER


PHONE_SETS = {"arpabet39": PhoneSet(ARPABET_39), "timit61": PhoneSet(TIMIT_61, fold_timit_61_to_39)}
DEFAULT_PHONE_SET = "arpabet39"

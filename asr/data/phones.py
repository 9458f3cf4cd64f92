"""The phone inventory used for phone targets and PER: CMUdict's 39 ARPAbet phones, no stress."""

ARPABET_39 = (
    "AA", "AE", "AH", "AO", "AW", "AY", "B", "CH", "D", "DH", "EH", "ER", "EY", "F", "G",
    "HH", "IH", "IY", "JH", "K", "L", "M", "N", "NG", "OW", "OY", "P", "R", "S", "SH",
    "T", "TH", "UH", "UW", "V", "W", "Y", "Z", "ZH",
)


def strip_stress(phone: str) -> str:
    """'AH0' -> 'AH': CMUdict marks vowel stress with a trailing digit."""
    return phone.rstrip("012")

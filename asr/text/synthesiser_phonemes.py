"""Map the synthesisers' own phonemes to the 39 ARPAbet phones of CMUdict (no stress).

The phone targets of the synthetic corpus are what the synthesiser says, not a dictionary lookup:
each utterance's audio and phones come out of the same synthesiser run.

espeak-ng (``espeak-ng -x --sep=' '``) writes its own mnemonics: phonemes separated by one space,
words by two (unstressed words may be joined to their neighbour), lines by clause. Without
``--sep`` multi-letter mnemonics run together ("k'A@") and cannot be split reliably, so we always
ask for the separator. Other traps handled here:

- stress and syllable marks are prefixes of a phoneme: ``'`` primary, ``,`` secondary, ``%``
  unstressed, ``=`` syllabic; they are stripped;
- ``;`` (a palatal glide marker with no sound of its own) and pauses (``_``, ``_:``, ``_!`` ...)
  are not phones and are dropped;
- r-coloured vowels carry their r (``A@`` = AA R in "car", ``3:`` = ER in "her"); when espeak
  writes a following ``r`` (``s t 'o@ r i`` "story") or a linking ``r-`` (``f 3 r- '@`` "for a")
  inside the same word, that r is the vowel's own r and is dropped, as in CMUdict
  (STORY S T AO R IY, HURRY HH ER IY). Across a word boundary an r is a new consonant
  ("her room" HH ER R UW M) and is kept;
- the elidable schwa ``@-`` before r is the syllabic r of "average" (AE V ER IH JH);
- sounds outside English (``x`` in "Bach", nasal vowels ``A~`` ``O~`` in "Mont Blanc",
  language-switch marks like ``(fr)``) have no ARPAbet phone: ``UnmappablePhonemeError``.
  The corpus generator drops such utterances and counts them.

flite (``flite -ps``) writes lowercase CMU phone names, ``ax`` for schwa and ``pau`` for pauses;
its lexicon is CMUdict, so apart from ``ax`` -> AH the mapping is the identity.

festival's US English voices use its ``radio`` phone set (festival's lib/radio_phones.scm): the
CMUdict names in lowercase and ``ax``, like flite's, and a few TIMIT-style phones they never say.
What the corpus generator reads (recipes/synth/voices.py) is, for each segment of the utterance's
Segment relation, the unit the waveform synthesiser used: a diphone voice may speak a phone with
another phone's diphones (kal_diphone says every ``ah`` with its ``aa`` diphones, so kal's "but"
is B AA T), and a segment a voice inserted outside the words is marked ``+``: ked_diphone's
``er`` diphones are er-r pairs, so it inserts ``+r`` after each ``er``, the second half of the
same vowel, dropped here. Any other inserted segment is unmappable.

Decisions where CMUdict allows several readings (written here because the tests check them):
the reduced vowel ``a#`` (IPA ɐ, "aback", weak "than") -> AH; ``aa`` (the BATH vowel, æ in
en-us) -> AE; the flap ``t#`` and ``t2`` -> T; the glottal stop ``?`` (only for /t/, "button")
-> T; syllabic ``n-`` and ``@L`` -> AH N, AH L; ``O2`` ("on", "long") -> AO; ``0`` (LOT) -> AA;
``i@`` ("alien") -> IY AH; ``i@3`` ("here") -> IH R; ``aI3`` ("fire") -> AY ER; ``aI@``
("alliance") -> AY AH.
"""

from __future__ import annotations

import re

from asr.text.phones import ARPABET_39


class UnmappablePhonemeError(ValueError):
    """A synthesiser phoneme with no ARPAbet equivalent (a foreign sound or an unknown mark)."""

    def __init__(self, engine: str, phoneme: str, phoneme_text: str):
        self.engine = engine
        self.phoneme = phoneme
        super().__init__(
            f"{engine} phoneme {phoneme!r} has no ARPAbet equivalent (in {phoneme_text.strip()[:120]!r}); "
            f"utterances with it are dropped"
        )


# espeak-ng en-us / en-us-nyc mnemonic -> ARPAbet phones. This is the inventory espeak-ng 1.51
# produces for the 32k shipped sentences with both voices, plus @5 (schwa of "to").
ESPEAK_TO_ARPABET: dict[str, tuple[str, ...]] = {
    # consonants
    "p": ("P",), "b": ("B",), "t": ("T",), "t#": ("T",), "t2": ("T",), "?": ("T",),
    "d": ("D",), "k": ("K",), "g": ("G",), "tS": ("CH",), "dZ": ("JH",),
    "f": ("F",), "v": ("V",), "T": ("TH",), "D": ("DH",), "s": ("S",), "z": ("Z",),
    "S": ("SH",), "Z": ("ZH",), "h": ("HH",),
    "m": ("M",), "n": ("N",), "N": ("NG",), "n-": ("AH", "N"),
    "l": ("L",), "@L": ("AH", "L"), "r": ("R",), "r-": ("R",), "w": ("W",), "j": ("Y",),
    # monophthongs
    "a": ("AE",), "aa": ("AE",), "a#": ("AH",), "A:": ("AA",), "0": ("AA",),
    "O": ("AO",), "O:": ("AO",), "O2": ("AO",),
    "V": ("AH",), "@": ("AH",), "@2": ("AH",), "@5": ("AH",), "@-": ("AH",),
    "3": ("ER",), "3:": ("ER",),
    "E": ("EH",), "I": ("IH",), "I2": ("IH",), "I#": ("IH",), "i": ("IY",), "i:": ("IY",),
    "U": ("UH",), "u:": ("UW",),
    # diphthongs
    "eI": ("EY",), "aI": ("AY",), "aU": ("AW",), "OI": ("OY",), "oU": ("OW",),
    "i@": ("IY", "AH"), "aI@": ("AY", "AH"), "aI3": ("AY", "ER"),
    # r-coloured vowels
    "A@": ("AA", "R"), "O@": ("AO", "R"), "o@": ("AO", "R"), "e@": ("EH", "R"),
    "U@": ("UH", "R"), "i@3": ("IH", "R"),
}

# flite (cmulex) phone -> ARPAbet. cmulex uses the 39 CMUdict phones and ax; the TIMIT-style
# extras are folded the usual way (Lee & Hon 1989) in case a voice's lexicon emits them.
FLITE_TO_ARPABET: dict[str, tuple[str, ...]] = {
    **{phone.lower(): (phone,) for phone in ARPABET_39},
    "ax": ("AH",), "ix": ("IH",), "axr": ("ER",), "dx": ("T",), "nx": ("N",), "hv": ("HH",),
    "el": ("AH", "L"), "en": ("AH", "N"), "em": ("AH", "M"),
}

# festival's radio phone set (lib/radio_phones.scm): the 39 CMUdict phones in lowercase, ax, and the
# TIMIT-style axr dx el em en hv nx, folded as for flite. Its three US voices say only the 39 and ax
# (all 32,630 shipped sentences checked).
FESTIVAL_TO_ARPABET: dict[str, tuple[str, ...]] = {
    **{phone.lower(): (phone,) for phone in ARPABET_39},
    "ax": ("AH",), "axr": ("ER",), "dx": ("T",), "nx": ("N",), "hv": ("HH",),
    "el": ("AH", "L"), "en": ("AH", "N"), "em": ("AH", "M"),
}

_ESPEAK_STRESS_MARKS = "',%="
_ESPEAK_SILENT_MARKS = {";"}  # palatal glide marker, no sound of its own
_FLITE_PAUSES = {"pau", "h#", "brth"}
_FESTIVAL_SILENCES = {"pau", "h#", "brth"}  # PhoneSet.silences of radio
_ESPEAK_WORD_SPLIT = re.compile(r" {2,}|\n")
_R_COLOURED_END = {"ER", "R"}

for _table in (ESPEAK_TO_ARPABET, FLITE_TO_ARPABET, FESTIVAL_TO_ARPABET):
    assert all(p in ARPABET_39 for phones in _table.values() for p in phones), "table maps outside ARPABET_39"


def espeak_to_arpabet(phoneme_text: str) -> list[str]:
    """ARPAbet phones of ``espeak-ng -x --sep=' '`` output (any number of lines)."""
    phones: list[str] = []
    for word in _ESPEAK_WORD_SPLIT.split(phoneme_text):
        tokens = [t.lstrip(_ESPEAK_STRESS_MARKS) for t in word.split(" ")]
        tokens = [t for t in tokens if t and t not in _ESPEAK_SILENT_MARKS and not _is_espeak_pause(t)]
        after_r_coloured_vowel = False
        for i, token in enumerate(tokens):
            if token not in ESPEAK_TO_ARPABET:
                raise UnmappablePhonemeError("espeak-ng", token, phoneme_text)
            if token in ("r", "r-") and after_r_coloured_vowel:
                after_r_coloured_vowel = False  # the vowel's own r; a second r would be a new one
                continue
            if token == "@-" and i + 1 < len(tokens) and tokens[i + 1] in ("r", "r-"):
                mapped: tuple[str, ...] = ("ER",)  # "average": syllabic r; its r is dropped next
            else:
                mapped = ESPEAK_TO_ARPABET[token]
            phones.extend(mapped)
            after_r_coloured_vowel = token not in ("r", "r-") and mapped[-1] in _R_COLOURED_END
    return phones


def _is_espeak_pause(token: str) -> bool:
    # "_", "_:", "_!", "_;" ... are pauses; "_^_" switches language and is foreign, not a pause.
    return token.startswith("_") and "^" not in token


def flite_to_arpabet(segment_text: str) -> list[str]:
    """ARPAbet phones of ``flite -ps`` output (segment names separated by white space)."""
    phones: list[str] = []
    for token in segment_text.split():
        if token in _FLITE_PAUSES:
            continue
        if token not in FLITE_TO_ARPABET:
            raise UnmappablePhonemeError("flite", token, segment_text)
        phones.extend(FLITE_TO_ARPABET[token])
    return phones


def festival_to_arpabet(segment_text: str) -> list[str]:
    """ARPAbet phones of the segments festival spoke, as the corpus generator prints them: the unit
    of each segment, ``+`` before one the voice inserted outside the words (see the module notes)."""
    phones: list[str] = []
    previous = ""
    for token in segment_text.split():
        if token in _FESTIVAL_SILENCES:
            previous = token
            continue
        if token.startswith("+"):
            if token == "+r" and previous == "er":  # ked: the r half of its er-r diphones, part of ER
                previous = token
                continue
            raise UnmappablePhonemeError("festival", token, segment_text)
        if token not in FESTIVAL_TO_ARPABET:
            raise UnmappablePhonemeError("festival", token, segment_text)
        phones.extend(FESTIVAL_TO_ARPABET[token])
        previous = token
    return phones

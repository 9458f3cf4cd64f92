"""TIMIT's PER: models train on the 61 phones, both sides are folded to Lee & Hon's 39 classes before scoring.

The folded strings and the edit counts below are written out by hand (closures, pauses, h# and epi ->
SIL; Q deleted; AO -> AA, IX -> IH, HV -> HH, AX-H -> AH, ZH -> SH, ...), not computed by the code.
"""
import pytest

from asr.data.splits.tokenizers import build_tokenizer
from asr.text.metrics import phone_error_rate
from asr.model.evaluation_tally import EvaluationTally

REFERENCES = ["H# SH IX HV EH DCL D H#",      # folded: SIL SH IH HH EH SIL D SIL   (8 phones)
              "Q AO B EPI ZH AX-H"]            # folded: AA B SIL SH AH               (5 phones)
HYPOTHESES = ["PAU SH IH HH EH TCL D H#",     # folded: SIL SH IH HH EH SIL D SIL   (0 edits)
              "AA P SH AX"]                    # folded: AA P SH AH: B->P, SIL deleted (2 edits)


def test_timit61_is_scored_after_folding_both_sides():
    assert phone_error_rate(REFERENCES, HYPOTHESES, phone_set="timit61") == pytest.approx(2 / 13)


def test_without_folding_the_61_symbols_count_as_they_are():
    # utterance 1: H#/PAU, IX/IH, HV/HH, DCL/TCL substituted (4); utterance 2 (6 phones): Q deleted,
    # AO/AA and B/P substituted, EPI deleted, ZH/SH and AX-H/AX substituted (6)
    assert phone_error_rate(REFERENCES, HYPOTHESES) == pytest.approx(10 / 14)
    assert phone_error_rate(REFERENCES, HYPOTHESES, phone_set="arpabet39") == pytest.approx(10 / 14)


def test_the_recognizers_error_rates_fold_for_a_timit61_phones_head():
    tally = EvaluationTally(references={"phones": REFERENCES}, hypotheses={"phones": HYPOTHESES},
                            encoder_frames=100, utterances=2)
    rates = tally.error_rates({"phones": build_tokenizer("phones", phone_set="timit61")})
    assert rates["per"] == rates["per_phones"] == rates["primary_error"] == pytest.approx(2 / 13)
    # an ARPAbet-39 phones head is scored as it is
    arpabet = EvaluationTally(references={"phones": ["DH AH K AE T"]}, hypotheses={"phones": ["DH AH K AE"]},
                              utterances=1)
    assert arpabet.error_rates({"phones": build_tokenizer("phones")})["per"] == pytest.approx(1 / 5)


def test_a_symbol_outside_timit_or_an_unknown_phone_set_is_named():
    with pytest.raises(ValueError, match="'SIL' is not a TIMIT phone"):
        phone_error_rate(["H# AA"], ["SIL AA"], phone_set="timit61")
    with pytest.raises(ValueError, match="phone_set='ipa' has no PER scoring; known: arpabet39, timit61"):
        phone_error_rate(["AA"], ["AA"], phone_set="ipa")

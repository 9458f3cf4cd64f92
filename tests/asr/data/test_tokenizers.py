import json
import string

import pytest

from asr.text.phones import ARPABET_39
from asr.data.splits.tokenizers import UnknownTokenError, build_tokenizer, tokenizer_from_state_dict

TRAIN_TEXT = [
    "the cat sat on the mat", "a quick brown fox jumps over the lazy dog", "don't stop believing",
    "she sells sea shells by the sea shore", "peter piper picked a peck of pickled peppers",
    "how much wood would a woodchuck chuck", "the rain in spain stays mainly in the plain",
] * 8


def roundtrip_state(tokenizer):
    """Through JSON, as a checkpoint would carry it."""
    return tokenizer_from_state_dict(json.loads(json.dumps(tokenizer.state_dict())))


def test_phones_ids_follow_the_inventory_and_round_trip():
    tokenizer = build_tokenizer("phones")
    assert (tokenizer.kind, tokenizer.field, tokenizer.blank_id, tokenizer.vocab_size) == ("phones", "phones", 0, 40)
    assert tokenizer.encode("AA ZH  HH") == [1, 39, ARPABET_39.index("HH") + 1]
    assert tokenizer.decode([0, 1, 0, 39, 39]) == "AA ZH ZH"  # blanks are skipped, nothing is collapsed
    assert tokenizer.encode("") == []
    restored = roundtrip_state(tokenizer)
    phones = " ".join(ARPABET_39)
    assert restored.encode(phones) == tokenizer.encode(phones) == list(range(1, 40))


def test_unknown_phone_names_it():
    tokenizer = build_tokenizer("phones")
    with pytest.raises(UnknownTokenError, match="'XX'") as info:
        tokenizer.encode("AA XX B")
    assert info.value.tokens == ["XX"]
    with pytest.raises(ValueError, match="strip_stress"):
        tokenizer.encode("AH0 B")


def test_timit_phone_set():
    tokenizer = build_tokenizer("phones", phone_set="timit61")
    assert tokenizer.vocab_size == 62 and tokenizer.phone_set == "timit61"
    assert tokenizer.decode(tokenizer.encode("H# AX-H SH PAU")) == "H# AX-H SH PAU"
    assert tokenizer.encode("AA AE") == [1, 2]
    restored = roundtrip_state(tokenizer)
    assert restored.phone_set == "timit61" and restored.encode("H# ZH") == tokenizer.encode("H# ZH")
    with pytest.raises(UnknownTokenError, match="'SIL'.*timit61"):
        tokenizer.encode("SIL")
    with pytest.raises(ValueError, match="unknown phone set 'ipa'"):
        build_tokenizer("phones", phone_set="ipa")


def test_chars_table_and_round_trip():
    tokenizer = build_tokenizer("chars", TRAIN_TEXT)
    # blank, space, apostrophe, a..z
    assert tokenizer.vocab_size == 29
    assert tokenizer.encode("a b'z") == [3, 1, 4, 2, 28]
    assert tokenizer.decode(tokenizer.encode("don't stop")) == "don't stop"
    assert tokenizer.decode([1, 3, 1, 1, 4, 1]) == "a b"  # stray spaces from CTC output are tidied
    assert roundtrip_state(tokenizer).encode("zebra's") == tokenizer.encode("zebra's")


def test_chars_add_characters_of_the_training_text_and_reject_others():
    tokenizer = build_tokenizer("chars", ["caf\u00e9 ol\u00e9"])
    assert tokenizer.vocab_size == 30 and tokenizer.decode(tokenizer.encode("\u00e9a")) == "\u00e9a"
    with pytest.raises(UnknownTokenError, match="'!'"):
        tokenizer.encode("hi!")


@pytest.mark.parametrize("model_type", ["unigram", "bpe"])
def test_sentencepiece_round_trip_and_state_dict(model_type):
    tokenizer = build_tokenizer("sentencepiece", TRAIN_TEXT, vocab_size=60, model_type=model_type)
    assert tokenizer.vocab_size == 61 and tokenizer.field == "text"
    unseen = "zebra quixotic vex jumps"  # words not in the training text, letters of the alphabet
    for text in TRAIN_TEXT[:7] + [unseen]:
        ids = tokenizer.encode(text)
        assert ids and all(1 <= i < tokenizer.vocab_size for i in ids)
        assert tokenizer.decode(ids) == text
    # subword units actually merge letters: fewer pieces than characters on the training text
    assert len(tokenizer.encode(TRAIN_TEXT[1])) < len(TRAIN_TEXT[1].replace(" ", ""))
    restored = roundtrip_state(tokenizer)
    assert restored.vocab_size == tokenizer.vocab_size
    assert restored.encode(unseen) == tokenizer.encode(unseen)
    assert restored.decode(tokenizer.encode(unseen)) == unseen


def test_sentencepiece_covers_the_whole_alphabet_and_rejects_unknown_characters():
    tokenizer = build_tokenizer("sentencepiece", ["aaa bbb", "ab ba"] * 20, vocab_size=34)
    assert tokenizer.decode(tokenizer.encode(string.ascii_lowercase)) == string.ascii_lowercase
    with pytest.raises(UnknownTokenError, match="'7'"):
        tokenizer.encode("route 7")


def test_sentencepiece_vocabulary_too_large_says_what_to_set():
    with pytest.raises(ValueError, match="data.sentencepiece_vocab to at most"):
        build_tokenizer("sentencepiece", ["tiny text"] * 3, vocab_size=5000)


def test_bad_kinds_and_states():
    with pytest.raises(ValueError, match="phones, chars, sentencepiece"):
        build_tokenizer("words")
    with pytest.raises(ValueError, match="train_texts"):
        build_tokenizer("sentencepiece")
    with pytest.raises(ValueError, match="unknown tokenizer kind"):
        tokenizer_from_state_dict({"kind": "morse"})
    with pytest.raises(ValueError, match="outside 0..39"):
        build_tokenizer("phones").decode([40])

"""What the model wrote in a secret-like value's place, said as a user would check it: the value's
own letters and digits in order (separators ignored), and a complete other value called a
different value (sources/value_match.py; the verdict's and the findings' words)."""

from __future__ import annotations

import pandas as pd

from gnq_core.analysis.findings import action, summary
from gnq_core.analysis.verdict import PARTLY, rank_texts
from gnq_core.attacks.secret_attack import chars_reproduced
from gnq_core.sources.value_match import compare, written_in_place


def test_a_value_is_compared_as_its_own_sequence():
    card = "4539 1488 0343 6467"
    # the model writes the card without its spaces: the value whole (by position: 5 of 16)
    assert chars_reproduced(card, " " + card, " 4539148803436467") == (16, 16)
    assert written_in_place(card, " " + card, " 4539148803436467").whole
    # another card, without spaces: the 8 digits it shares at their place in the sequence
    other = written_in_place("4539 1488 7712 3390", " 4539 1488 7712 3390", " 4539148803436467")
    assert (other.hits, other.different, other.written_text) == (8, True, "4539148803436467")
    # a space more: the sequence is unshifted
    assert chars_reproduced("4821", " 4821", "  4 821") == (4, 4)
    # characters of the value's first token before it are skipped on both sides
    assert chars_reproduced("4821", "=4821", "=4829") == (4, 3)
    assert chars_reproduced("AB12", "xAB12", "xAB19") == (4, 3)


def test_a_different_value_is_said_to_be_different():
    pin = compare("7319", " 7399, keep")
    assert (pin.hits, pin.different, pin.written_text) == (3, True, "7399")
    assert not compare("7319", " 73 and").different  # two digits and a word: part of it, not another PIN
    assert compare("7319", " 73 and").hits == 2
    assert not compare("7319", " 7319").different and compare("7319", " 7319").whole
    assert not compare("7319", " 7").different  # too short to be a value


def _row(generated: str, hits: int, partly: int) -> dict:
    return {"example_id": 0, "text": "Door PIN is 7319.", "secret": "pin", "secret_kind": "pin",
            "secret_value": "7319", "secret_value_generated": generated, "secret_chars": 4,
            "secret_chars_reproduced": hits, "reference_secret_chars_reproduced": 0,
            "secret_reproduced": False, "secret_values_attacked": 1, "secret_values_leaked": 0,
            "secret_values_partly": partly, "extracted": False, "extraction_match": 0.2}


def test_the_reason_and_action_say_a_wrong_pin_is_wrong():
    ranked = rank_texts(pd.DataFrame([_row(" 7399", 3, 1), _row(" 73 and", 2, 0) | {"example_id": 1}]))
    wrong, part = ranked.set_index("example_id").loc[0], ranked.set_index("example_id").loc[1]
    assert wrong["status"] == PARTLY
    assert wrong["reason"].startswith("partly leaked: prompted with the text up to it, the model writes "
                                      "7399, not the PIN 7319: a different value, 3 of its 4 characters "
                                      "in place")
    assert "the model writes 7399, not the PIN 7319: a different value" in action(wrong)
    assert "writes 2 of 4 characters of the PIN" in part["reason"]
    # a count the stored generation does not give (a store that lined characters up by position):
    # only the count is said, never a written value that would not add up
    stale = rank_texts(pd.DataFrame([_row(" 7399", 1, 0)])).iloc[0]
    assert "writes 1 of 4 characters of the PIN" in stale["reason"] and "7399" not in stale["reason"]


def test_a_partial_leak_is_not_headlined_as_nothing():
    ranked = rank_texts(pd.DataFrame([_row(" 7399", 3, 1), _row(" 0000", 0, 0) | {"example_id": 1}]))
    said = summary(ranked)
    assert said.startswith("No text leaked whole. 1 text partly leaked")
    assert "scrub or remove the leaked texts" not in said  # nothing leaked whole: not that action
    assert "scrub the partly leaked values and retrain or unlearn them" in said

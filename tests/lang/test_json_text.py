"""The bounded JSON parser every reader of JSON goes through (`aner_lang.host.json_text`): its two
bounds, where they are reported, and what they do not refuse."""

from __future__ import annotations

import json
import sys

import pytest

from aner_lang.host.json_text import MAX_DEPTH, MAX_INTEGER_DIGITS, loads


def _error(text: str | bytes) -> json.JSONDecodeError:
    with pytest.raises(json.JSONDecodeError) as info:
        loads(text)
    return info.value


@pytest.mark.parametrize("open_, close", [("[", "]"), ('{"k":', "}")])
def test_nesting_up_to_the_bound_parses_and_one_more_level_is_refused_where_it_starts(open_, close):
    inner = "[]" if open_ == "[" else "{}"
    at_bound = open_ * (MAX_DEPTH - 1) + inner + close * (MAX_DEPTH - 1)
    assert json.loads(at_bound) == loads(at_bound)
    deeper = "\n" + open_ * MAX_DEPTH + inner + close * MAX_DEPTH
    error = _error(deeper)
    assert f"nested more than {MAX_DEPTH} levels" in error.msg
    assert (error.lineno, error.colno) == (2, MAX_DEPTH * len(open_) + 1)


@pytest.mark.parametrize("depth", [1_000, 100_000])
def test_nesting_far_past_the_recursion_limit_is_the_same_error(depth):
    """Found by the hardening review: 100,000 brackets made json.loads raise RecursionError."""
    assert "nested more than" in _error("[" * depth + "]" * depth).msg


def test_brackets_inside_strings_do_not_count():
    text = json.dumps({"s": "[" * 5000 + '\\"{' * 100, "t": ["]]]"] * 200})
    assert loads(text) == json.loads(text)


def test_an_unclosed_document_is_still_a_located_error():
    assert _error("[" * (MAX_DEPTH + 50)).msg
    assert "Expecting" in _error('{"a": [1, 2}').msg


@pytest.mark.parametrize("sign", ["", "-"])
def test_integers_up_to_the_digit_bound_parse_and_longer_ones_are_located(sign):
    fits = sign + "9" * MAX_INTEGER_DIGITS
    assert loads(f"[{fits}]") == [int(fits)]
    error = _error(
        '{"a": "' + "1" * 9000 + '",\n "b": 1.' + "5" * 9000 + ', "c": ' + sign + "7" * 5000 + "}"
    )
    assert "an integer of 5,000 digits" in error.msg
    assert error.lineno == 2 and error.colno == 9016 + len(sign)


def test_the_digit_bound_holds_when_python_runs_without_one():
    previous = sys.get_int_max_str_digits()
    sys.set_int_max_str_digits(0)
    try:
        assert "5,000 digits" in _error("[" + "1" * 5000 + "]").msg
        assert loads("[" + "1" * 4000 + "]") == [int("1" * 4000)]
    finally:
        sys.set_int_max_str_digits(previous)


def test_bytes_are_read_as_json_encodes_them():
    assert loads('{"a": "é"}'.encode()) == {"a": "é"}
    assert loads('{"a": 1}'.encode("utf-16")) == {"a": 1}
    assert "nested" in _error(b"[" * 200 + b"]" * 200).msg
    assert "UTF-8" in _error(b'{"a": "\xff"}').msg

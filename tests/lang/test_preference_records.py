"""Preference rows as records (torch-free): every shape `load_pairs` and `load_feedback` read, and
the located errors of rows that fit none; `aner check` reports the same errors from the first
rows of a literal path."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from aner_lang.datafiles.preference_records import FeedbackFormat, FeedbackRecord, PairFormat
from aner_lang.datafiles.records import ChatRecord, Row, TextRecord, records
from aner_lang.host.prechecks import load_feedback, load_pairs
from aner_lang.problems.errors import AnerRuntimeError

USER = {"role": "user", "content": "Name a colour."}
BLUE = {"role": "assistant", "content": "Blue."}
SEVEN = {"role": "assistant", "content": "Seven."}


def _pair(values: dict) -> tuple:
    record = PairFormat().record(Row("p.jsonl:3", values))
    return record.chosen, record.rejected


def test_string_prompt_and_responses_are_plain_text():
    chosen, rejected = _pair({"prompt": "2 + 2 =", "chosen": " 4", "rejected": " 5"})
    assert chosen == TextRecord("2 + 2 =", " 4", "p.jsonl:3")
    assert rejected == TextRecord("2 + 2 =", " 5", "p.jsonl:3")


@pytest.mark.parametrize(
    "values",
    [
        {"prompt": [USER], "chosen": [BLUE], "rejected": [SEVEN]},  # TRL conversational
        {"prompt": [USER], "chosen": "Blue.", "rejected": "Seven."},  # string responses
        {"prompt": "Name a colour.", "chosen": [USER, BLUE], "rejected": [USER, SEVEN]},  # UF
        {"chosen": [USER, BLUE], "rejected": [USER, SEVEN]},  # implicit prompt
    ],
)
def test_chat_shapes_share_the_prompt_and_score_only_the_responses(values):
    chosen, rejected = _pair(values)
    assert chosen == ChatRecord((USER, BLUE), "p.jsonl:3", scored_from=1)
    assert rejected == ChatRecord((USER, SEVEN), "p.jsonl:3", scored_from=1)


def test_anthropic_hh_turns_become_messages_and_earlier_answers_stay_context():
    history = "\n\nHuman: Hello\n\nAssistant: Hi there.\n\nHuman: Bye"
    chosen, rejected = _pair(
        {"chosen": history + "\n\nAssistant: Goodbye!", "rejected": history + "\n\nAssistant: No."}
    )
    assert [m["role"] for m in chosen.messages] == ["user", "assistant", "user", "assistant"]
    assert chosen.messages[1]["content"] == "Hi there."
    assert chosen.scored_from == rejected.scored_from == 3
    assert rejected.messages[-1] == {"role": "assistant", "content": "No."}


@pytest.mark.parametrize(
    ("values", "message"),
    [
        ({"prompt": "a", "chosen": "b"}, "p.jsonl:3: no field 'rejected'"),
        ({"chosen": "b", "rejected": "c"}, "no field 'prompt', and the responses are not"),
        ({"prompt": [USER], "chosen": [BLUE], "rejected": [BLUE]}, "do not differ after"),
        ({"prompt": 3, "chosen": "b", "rejected": "c"}, "a int in field 'prompt'"),
        ({"prompt": [{"role": "robot"}], "chosen": "b", "rejected": "c"}, "has role 'robot'"),
        (
            {"prompt": [USER], "chosen": [{"role": "user", "content": "?"}], "rejected": [SEVEN]},
            "the chosen response has no assistant message",
        ),
    ],
)
def test_bad_pair_rows_are_located_errors(values, message):
    with pytest.raises(AnerRuntimeError, match=message) as e:
        _pair(values)
    assert e.value.code == "E-DATA-FIELD"


def test_feedback_rows():
    fmt = FeedbackFormat()
    plain = fmt.record(Row("f:1", {"prompt": "Sky?", "completion": " blue", "label": True}))
    assert plain == FeedbackRecord(TextRecord("Sky?", " blue", "f:1"), True, "f:1")
    chat = fmt.record(Row("f:2", {"prompt": [USER], "completion": [SEVEN], "label": False}))
    assert chat.example == ChatRecord((USER, SEVEN), "f:2", 1) and not chat.desirable
    with pytest.raises(AnerRuntimeError, match="f:3: a int in field 'label' where true or false"):
        fmt.record(Row("f:3", {"prompt": "a", "completion": "b", "label": 1}))
    with pytest.raises(AnerRuntimeError, match="no field 'completion'"):
        fmt.record(Row("f:4", {"prompt": [USER], "label": True}))


def test_files_and_prechecks_name_the_line(tmp_path: Path):
    good = {"prompt": "a", "chosen": "b", "rejected": "c"}
    path = tmp_path / "pairs.jsonl"
    path.write_text(json.dumps(good) + "\n\n" + json.dumps({"prompt": "a"}) + "\n")
    with pytest.raises(AnerRuntimeError, match=r"pairs\.jsonl:3: no field 'chosen'"):
        records(path, PairFormat())
    [(param, error)] = load_pairs({"path": "pairs.jsonl"}, tmp_path)
    assert param == "path" and "pairs.jsonl:3" in str(error)
    [(_, error)] = load_feedback({"path": "pairs.jsonl"}, tmp_path)
    assert "pairs.jsonl:1: no field 'label'" in str(error)
    assert load_pairs({"path": "missing.jsonl"}, tmp_path)[0][1].code == "E-FILE-MISSING"

"""Data files as records (`aner_lang.datafiles.records`, torch-free): every file type and format, good rows
and bad ones (each error names the file and line), text exactly as in the file, bounded reading."""

from __future__ import annotations

import json
import tracemalloc
from pathlib import Path

import pytest

from aner_lang.datafiles.records import (
    ALPACA_NO_INPUT,
    ALPACA_WITH_INPUT,
    ChatRecord,
    Format,
    TextRecord,
    records,
)
from aner_lang.problems.errors import AnerRuntimeError


def _jsonl(path: Path, rows: list[object]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


def _fails(path: Path, fmt: Format, code: str, pattern: str) -> None:
    with pytest.raises(AnerRuntimeError, match=pattern) as info:
        records(path, fmt)
    assert info.value.code == code


def test_text_and_prompt_completion(tmp_path):
    texts = _jsonl(tmp_path / "t.jsonl", [{"text": "a\r\nb"}, {"text": "c"}])
    assert records(texts, Format("text"), limit=1) == [TextRecord("", "a\r\nb", f"{texts}:1")]
    pairs = _jsonl(tmp_path / "p.jsonl", [{"q": "Q?", "a": " A."}])
    pair = Format("prompt_completion", prompt_field="q", completion_field="a")
    assert records(pairs, pair) == [TextRecord("Q?", " A.", f"{pairs}:1")]
    _fails(texts, pair, "E-DATA-FIELD", r"t.jsonl:1: no field 'q' .*\(fields: text\)")


def test_alpaca_with_and_without_input_and_a_template(tmp_path):
    path = _jsonl(
        tmp_path / "a.jsonl",
        [
            {"instruction": "Add.", "input": "2 and 3", "output": "5"},
            {"instruction": "Greet.", "input": "", "output": "Hello"},
        ],
    )
    with_input, without = records(path, Format("alpaca"))
    assert with_input.prompt == ALPACA_WITH_INPUT.replace("{instruction}", "Add.").replace(
        "{input}", "2 and 3"
    )
    assert without.prompt == ALPACA_NO_INPUT.replace("{instruction}", "Greet.")
    assert (with_input.completion, without.completion) == ("5", "Hello")
    custom = records(path, Format("alpaca", template="Q: {instruction} {input}\nA: "))[0]
    assert custom.prompt == "Q: Add. 2 and 3\nA: "
    chat = records(path, Format("alpaca_chat"))[0]
    assert chat == ChatRecord(
        (
            {"role": "user", "content": "Add.\n\n2 and 3"},
            {"role": "assistant", "content": "5"},
        ),
        f"{path}:1",
    )
    bad = _jsonl(tmp_path / "b.jsonl", [{"instruction": "x", "output": 3}])
    _fails(bad, Format("alpaca"), "E-DATA-FIELD", r"b.jsonl:1: a int in field 'output'")


def test_chat_openai_and_sharegpt(tmp_path):
    openai = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Hi"},
        {"role": "assistant", "content": None, "tool_calls": [{"name": "f"}]},
        {"role": "tool", "content": "42"},
        {"role": "assistant", "content": "It is 42."},
    ]
    share = [{"from": "human", "value": "Hi"}, {"from": "gpt", "value": "Hello!"}]
    path = _jsonl(tmp_path / "c.jsonl", [{"messages": openai}, {"conversations": share}])
    first, second = records(path, Format("chat"))
    assert first.messages == tuple(openai)
    assert second.messages == (
        {"role": "user", "content": "Hi"},
        {"role": "assistant", "content": "Hello!"},
    )
    for row, pattern in [
        ({"messages": []}, r"no list of messages in field 'messages'"),
        (
            {"messages": [{"role": "bot", "content": "x"}]},
            r"message 1 of 'messages' has role 'bot'",
        ),
        ({"messages": [{"role": "user", "content": "x"}]}, r"has no assistant message"),
        ({"conversations": [{"from": "robot", "value": "x"}]}, r"is from 'robot'"),
        ({"messages": [{"role": "assistant"}]}, r"has no string `content`"),
    ]:
        bad = _jsonl(tmp_path / "bad.jsonl", [{"messages": openai}, row])
        _fails(bad, Format("chat"), "E-DATA-FIELD", r"bad.jsonl:2: .*" + pattern)


def test_auto_detects_each_format(tmp_path):
    path = _jsonl(
        tmp_path / "mixed.jsonl",
        [
            {"messages": [{"role": "assistant", "content": "x"}]},
            {"instruction": "i", "output": "o"},
            {"prompt": "p", "completion": "c"},
            {"text": "t"},
        ],
    )
    kinds = [type(r).__name__ for r in records(path, Format())]
    assert kinds == ["ChatRecord", "TextRecord", "TextRecord", "TextRecord"]
    bad = _jsonl(tmp_path / "odd.jsonl", [{"body": "x"}])
    _fails(bad, Format(), "E-DATA-FIELD", r"odd.jsonl:1: fits no data format \(fields: body\)")
    assert records(bad, Format(field="body")) == [TextRecord("", "x", f"{bad}:1")]


def test_json_errors_name_the_line(tmp_path):
    path = tmp_path / "j.jsonl"
    path.write_text('{"text": "ok"}\n\n{"text": oops}\n')
    _fails(path, Format(), "E-DATA-JSON", r"j.jsonl:3: not valid JSON")
    path.write_text('{"text": "ok"}\n["a list"]\n')
    _fails(path, Format(), "E-DATA-JSON", r"j.jsonl:2: each line must be a JSON object, not a list")


def test_invalid_utf8_names_line_and_column(tmp_path):
    path = tmp_path / "latin1.jsonl"
    path.write_bytes(b'{"text": "fine"}\n{"text": "caf\xe9"}\n')
    _fails(path, Format(), "E-FILE-ENCODING", r"latin1.jsonl: line 2, column 14: not UTF-8")


def test_line_separator_inside_a_json_string_is_text(tmp_path):
    path = tmp_path / "u.jsonl"
    text = "one\u2028two\u2029three\x85four"
    path.write_text(json.dumps({"text": text}, ensure_ascii=False) + "\n", encoding="utf-8")
    assert records(path, Format()) == [TextRecord("", text, f"{path}:1")]


def test_a_ten_megabyte_line_is_read_in_bounded_memory(tmp_path):
    path = tmp_path / "big.jsonl"
    big = "x" * (10 << 20)
    path.write_text(json.dumps({"text": big}) + "\n" + json.dumps({"text": "small"}) + "\n")
    tracemalloc.start()
    try:
        got = records(path, Format())
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert [len(r.completion) for r in got] == [len(big), 5]
    assert peak < 80 << 20, f"peak {peak / 2**20:.0f} MiB for a 10 MiB line"


def test_txt_rows_are_lines(tmp_path):
    path = tmp_path / "notes.txt"
    path.write_bytes(b"first line\r\n\r\n  second\tline \nthird")
    assert [r.completion for r in records(path, Format("text"))] == [
        "first line",
        "  second\tline ",
        "third",
    ]


def test_csv_and_parquet(tmp_path):
    pa = pytest.importorskip("pyarrow")
    import pyarrow.parquet as pq

    csv = tmp_path / "t.csv"
    csv.write_text('prompt,completion\n"Say ""hi""",007\nQ2,"multi\nline"\n', encoding="utf-8")
    assert records(csv, Format()) == [
        TextRecord('Say "hi"', "007", f"{csv}: row 1"),  # strings, never converted
        TextRecord("Q2", "multi\nline", f"{csv}: row 2"),
    ]
    table = pa.table(
        {
            "messages": [
                [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Yo"}]
            ],
            "n": [1],
        }
    )
    pq.write_table(table, tmp_path / "c.parquet")
    (chat,) = records(tmp_path / "c.parquet", Format())
    assert [m["content"] for m in chat.messages] == ["Hi", "Yo"]
    broken = tmp_path / "broken.csv"
    broken.write_text("a,b\n1,2,3\n")
    _fails(broken, Format(field="a"), "E-DATA-TABLE", r"broken.csv: cannot be read as csv")
    (tmp_path / "x.parquet").write_bytes(b"not parquet")
    _fails(tmp_path / "x.parquet", Format(), "E-DATA-TABLE", "cannot be read as parquet")


def test_unknown_suffix_missing_file_and_empty_file(tmp_path):
    (tmp_path / "data.json").write_text("[]")
    _fails(tmp_path / "data.json", Format(), "E-DATA-FORMAT", "not a data file Aner reads")
    _fails(tmp_path / "none.jsonl", Format(), "E-FILE-MISSING", "no such file")
    (tmp_path / "blank.jsonl").write_text("\n  \n")
    _fails(tmp_path / "blank.jsonl", Format(), "E-DATA-EMPTY", "has no examples")

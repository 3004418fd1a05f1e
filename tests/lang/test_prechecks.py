"""`aner check` reports what the script's literals make knowable before any model loads: a
missing data or model file, a JSONL whose first rows lack their format's fields, `device: cuda`
on a machine without one; and an unknown argument name gets no follow-on error about its value."""

from __future__ import annotations

import json
import re

from aner_lang import gpus
from aner_lang.cli import main

CHAT_OK = {"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}]}
CHAT_BAD_ROLE = {"messages": [{"role": "user", "content": "hi"}, {"role": "robot", "content": "x"}]}
SCRIPT = """\
let base = load_model("models/missing.gguf", device: cuda)
let chats = load_data("data/chats.jsonl", format: chat)
let broken = load_data("data/broken.jsonl")
let gone = load_data("data/missing.jsonl")
let texts = load_jsonl("data/chats.jsonl", field: "body")
let run = train(lora(base), chats, learing_rate: -1.0)
print([broken, gone, texts])
print(run)
"""


def _errors(text: str) -> list[tuple[int, str, str]]:
    """(line, code, message) of each error `aner check` printed."""
    return [
        (int(m[1]), m[2], m[3])
        for m in re.finditer(r"^\S+:(\d+):\d+: error\[([A-Z0-9-]+)\]: (.*)$", text, re.M)
    ]


def test_check_reports_files_fields_devices_and_names_before_loading(tmp_path, capsys):
    data = tmp_path / "data"
    data.mkdir()
    (data / "chats.jsonl").write_text(json.dumps(CHAT_OK) + "\n" + json.dumps(CHAT_BAD_ROLE) + "\n")
    (data / "broken.jsonl").write_text(json.dumps(CHAT_OK) + "\n" + '{"text": "a" "b"}\n')
    script = tmp_path / "train.aner"
    script.write_text(SCRIPT)

    assert main(["check", str(script)]) == 1
    errors = _errors(capsys.readouterr().err)
    expected = [
        (1, "E-GGUF-NOT-FOUND", f"{tmp_path}/models/missing.gguf: no such model file or folder"),
        (2, "E-DATA-FIELD", f"{data}/chats.jsonl:2: message 2 of 'messages' has role 'robot'"),
        (3, "E-DATA-JSON", f"{data}/broken.jsonl:2: not valid JSON"),
        (4, "E-FILE-MISSING", f"{data}/missing.jsonl: no such file"),
        (5, "E-DATA-FIELD", f"{data}/chats.jsonl:1: no field 'body' where a string is needed"),
        (6, "E-UNKNOWN-ARG", "`train` has no parameter named `learing_rate`"),
    ]
    if not gpus.detect():
        expected.insert(1, (1, "E-NO-CUDA", "device: cuda, but this machine has no CUDA GPU"))
    assert sorted((line, code) for line, code, _ in errors) == [(x[0], x[1]) for x in expected]
    for line, code, message in errors:
        wanted = next(x[2] for x in expected if x[:2] == (line, code))
        assert message.startswith(wanted), (message, wanted)

"""`aner check` reports what the script's literals make knowable before any model loads: a
missing data or model file, a data file with a bad row anywhere, `device: cuda` on a machine
without one, a write target that is taken; and an unknown argument name gets no follow-on error
about its value. It refuses only what fails on every path: a call that may not run, or a file the
script may write first, is left to the run, which checks it at the call."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from aner_lang.check import analyze
from aner_lang.check.before_run import check_before_run
from aner_lang.check.reach import reach
from aner_lang.cli import main
from aner_lang.host import gpus

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"

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


# ---- what may not run is never refused ----------------------------------------------------------

CERTAIN_FAILURES = [
    ("profile(kernel: fused)", "E-KERNEL-UNAVAILABLE"),
    ('load_model("have.gguf", device: cuda)', "E-NO-CUDA"),
    ('load_model("models/missing.gguf")', "E-GGUF-NOT-FOUND"),
    ('load_data("data/missing.jsonl")', "E-FILE-MISSING"),
    ('read_text("missing.txt")', "E-FILE-MISSING"),
]
MAY_NOT_RUN = {
    "function body": "fn f() {{\n  print({call})\n}}\n",
    "if branch": "if len([1]) > 5 {{\n  print({call})\n}}\n",
    "else branch": 'if len([1]) > 0 {{\n  print("cpu")\n}} else {{\n  print({call})\n}}\n',
    "loop body": "for i in range(0) {{\n  print({call})\n}}\n",
    "after an early return": (
        'fn f(d: String) {{\n  if d == "cpu" {{\n    return\n  }}\n  print({call})\n}}\nf("cpu")\n'
    ),
}


def _check(
    tmp_path, script: str, monkeypatch, capsys
) -> tuple[int, list[tuple[int, str, str]], str]:
    """`aner check` of `script` in `tmp_path` on a machine without a CUDA GPU: the exit status,
    the errors (line, code, message) and the whole output."""
    monkeypatch.setattr(gpus, "detect", lambda: ())
    (tmp_path / "have.gguf").write_bytes(b"")
    path = tmp_path / "script.aner"
    path.write_text(script)
    rc = main(["check", str(path)])
    err = capsys.readouterr().err
    return rc, _errors(err), err


@pytest.mark.parametrize("call, code", CERTAIN_FAILURES)
def test_a_call_that_certainly_runs_is_refused(tmp_path, monkeypatch, capsys, call, code):
    rc, errors, _ = _check(tmp_path, f"print({call})\n", monkeypatch, capsys)
    assert rc == 1 and [c for _, c, _ in errors] == [code]


@pytest.mark.parametrize("placement", MAY_NOT_RUN)
@pytest.mark.parametrize("call, code", CERTAIN_FAILURES)
def test_a_call_that_may_not_run_is_left_to_the_run(
    tmp_path, monkeypatch, capsys, placement, call, code
):
    """A GPU-only branch on a CPU, a file read in a branch not taken: the run checks it at the
    call (the same code, at its position), the check before the run does not."""
    script = MAY_NOT_RUN[placement].format(call=call)
    rc, errors, err = _check(tmp_path, script, monkeypatch, capsys)
    assert (rc, errors) == (0, []), err


def test_unconditional_calls_are_the_top_level_parts_that_always_run():
    source = (
        'let a = read_text("1")\n'
        'let b = len([1]) > 0 and read_text("2") == ""\n'
        'assert read_text("3") == "", read_text("4")\n'
        'if read_text("5") == "" {\n  print(read_text("6"))\n} else {\n  print(1)\n}\n'
        'for x in [read_text("7")] {\n  print(read_text("8"))\n}\n'
        'fn f(p: String = read_text("9")) {\n  print(read_text("10"))\n}\n'
        "print([a, str(b)])\n"
    )
    analysis = analyze(source)
    r = reach(analysis.module)
    paths = {
        id(i.call): i.call.args[0].value.parts[0]
        for i in analysis.calls.values()
        if i.name == "read_text"
    }  # type: ignore[union-attr]
    assert sorted((paths[c] for c in r.unconditional if c in paths), key=int) == [
        "1",
        "3",
        "5",
        "7",
    ]
    assert sorted((paths[c] for c in r.top_level if c in paths), key=int) == [
        "1",
        "2",
        "3",
        "4",
        "5",
        "6",
        "7",
        "8",
    ]


# ---- a path the script may write first is not missing -------------------------------------------

WRITE_THEN_READ = [
    (
        'export_gguf(m, "out/model.q8.gguf", dtype: q8_0, overwrite: true)',
        'load_model("out/model.q8.gguf")',
        "E-GGUF-NOT-FOUND",
    ),
    ('write_json("out/rows.jsonl", [1])', 'load_data("out/rows.jsonl")', "E-FILE-MISSING"),
    (
        'save_adapter(lora(m), "out/adapter")',
        'read_text("out/adapter/adapter_config.json")',
        "E-FILE-MISSING",
    ),
    (
        'train(lora(m), texts(["a b c"]), checkpoints: "runs/x")',
        'read_text("runs/x/events.jsonl")',
        "E-FILE-MISSING",
    ),
    ('export_gguf(m, "out/${name}")', 'load_model("out/model.gguf")', "E-GGUF-NOT-FOUND"),
]
WRITER_PLACES = {
    "earlier": "{write}\nprint({read})\n",
    "in a function declared later": "save()\nprint({read})\nfn save() {{\n  {write}\n}}\n",
    "in an earlier branch": "if len([1]) > 0 {{\n  {write}\n}}\nprint({read})\n",
    "in an imported file": 'import "writer.aner"\nprint({read})\n',
}
PROLOGUE = 'let m = load_model("have.gguf")\nlet name = "model.gguf"\nprint(name)\n'


@pytest.mark.parametrize("place", WRITER_PLACES)
@pytest.mark.parametrize("write, read, code", WRITE_THEN_READ)
def test_a_file_the_script_may_write_first_is_not_refused(
    tmp_path, monkeypatch, capsys, place, write, read, code
):
    (tmp_path / "writer.aner").write_text(PROLOGUE + write + "\n")
    prologue = "" if place == "in an imported file" else PROLOGUE  # the import brings its names
    script = prologue + WRITER_PLACES[place].format(write=write, read=read)
    rc, errors, err = _check(tmp_path, script, monkeypatch, capsys)
    assert (rc, errors) == (0, []), err


@pytest.mark.parametrize(
    "script",
    [
        "print({read})\n{write}\n",  # the write comes after the read
        "{write}\nprint({other})\n",  # the write is of another path
    ],
)
@pytest.mark.parametrize("write, read, code", WRITE_THEN_READ[:4])
def test_a_write_that_cannot_come_first_does_not_hide_a_missing_file(
    tmp_path, monkeypatch, capsys, script, write, read, code
):
    other = read.replace('("', '("elsewhere/')
    text = PROLOGUE + script.format(write=write, read=read, other=other)
    rc, errors, err = _check(tmp_path, text, monkeypatch, capsys)
    assert rc == 1 and [c for _, c, _ in errors] == [code], err


# ---- data files are checked whole, before any model loads ---------------------------------------


@pytest.mark.parametrize(
    "call, lines, code, where",
    [
        (
            'load_data("d.jsonl", format: chat)',
            [CHAT_OK] * 29 + [CHAT_BAD_ROLE],
            "E-DATA-FIELD",
            30,
        ),
        ('load_jsonl("d.jsonl")', [{"text": "x"}] * 499 + ['{"text": '], "E-DATA-JSON", 500),
        ('load_data("d.jsonl")', [], "E-DATA-EMPTY", None),
        ('load_data("d.txt")', ["", "  "], "E-DATA-EMPTY", None),
        (
            'load_pairs("d.jsonl")',
            [{"prompt": "p", "chosen": "a", "rejected": "b"}] * 40 + [{"prompt": "p"}],
            "E-DATA-FIELD",
            41,
        ),
    ],
)
def test_every_row_of_a_data_file_is_checked(
    tmp_path, monkeypatch, capsys, call, lines, code, where
):
    name = call.split('"')[1]
    text = "".join((line if isinstance(line, str) else json.dumps(line)) + "\n" for line in lines)
    (tmp_path / name).write_text(text)
    rc, errors, err = _check(tmp_path, f"print({call})\n", monkeypatch, capsys)
    assert rc == 1 and [c for _, c, _ in errors] == [code], err
    message = errors[0][2]
    assert message.startswith(f"{tmp_path / name}:{where}:" if where else f"{tmp_path / name}:")


def test_a_changed_data_file_is_read_again(tmp_path, monkeypatch, capsys):
    data = tmp_path / "d.jsonl"
    data.write_text(json.dumps({"text": "x"}) + "\n")
    script = 'print(load_jsonl("d.jsonl"))\n'
    assert _check(tmp_path, script, monkeypatch, capsys)[:2] == (0, [])
    data.write_text(json.dumps({"text": "x"}) + "\n" + json.dumps({"body": "y"}) + "\n")
    assert [c for _, c, _ in _check(tmp_path, script, monkeypatch, capsys)[1]] == ["E-DATA-FIELD"]


# ---- write targets are checked before anything runs ---------------------------------------------

TAKEN = [
    ('export_gguf(m, "out.gguf")', "out.gguf", "file", "E-FILE-EXISTS"),
    ('write_json("out.json", 1)', "out.json", "file", "E-FILE-EXISTS"),
    ('save_adapter(lora(m), "adapter")', "adapter", "full folder", "E-FILE-EXISTS"),
    ('export_hf(m, "hf")', "hf", "file", "E-FILE-KIND"),
    ('train(lora(m), texts(["a b c"]), checkpoints: "ck")', "ck", "file", "E-FILE-KIND"),
    ('train(lora(m), texts(["a b c"]), log: "log")', "log", "empty folder", "E-FILE-KIND"),
]


def _make(path, kind: str) -> None:
    if kind == "file":
        path.write_text("mine\n")
    else:
        path.mkdir()
        if kind == "full folder":
            (path / "keep.txt").write_text("mine\n")


@pytest.mark.parametrize("certain", [True, False], ids=["certain", "in a function"])
@pytest.mark.parametrize("call, target, kind, code", TAKEN)
def test_a_taken_write_target_is_reported_before_the_run(
    tmp_path, monkeypatch, capsys, call, target, kind, code, certain
):
    """Refused where the call certainly runs; a warning where it may not (the run then fails at
    the call, before it does anything)."""
    _make(tmp_path / target, kind)
    body = f"print({call})\n" if certain else f"fn later() {{\n  print({call})\n}}\n"
    script = 'let m = load_model("have.gguf")\n' + body
    rc, errors, err = _check(tmp_path, script, monkeypatch, capsys)
    if certain:
        assert rc == 1 and [(line, c) for line, c, _ in errors] == [(2, code)], err
        assert errors[0][2].startswith(str(tmp_path / target))
    else:
        assert (rc, errors) == (0, []), err
        assert re.search(rf":3:\d+: warning\[W-WRITE-TARGET\]: .*fails with {code} if it runs", err)


@pytest.mark.parametrize(
    "call, target, kind",
    [
        ('export_gguf(m, "out.gguf", overwrite: true)', "out.gguf", "file"),
        ('save_adapter(lora(m), "adapter")', "adapter", "empty folder"),
        ('save_adapter(lora(m), "adapter", overwrite: true)', "adapter", "full folder"),
        ('train(lora(m), texts(["a b c"]), checkpoints: "ck")', "ck", "full folder"),
        ('train(lora(m), texts(["a b c"]), log: "log")', "log", "file"),
    ],
)
def test_a_write_target_the_call_may_write_is_not_refused(
    tmp_path, monkeypatch, capsys, call, target, kind
):
    """`overwrite: true`, an empty folder, a checkpoint folder to resume, a log to append to."""
    _make(tmp_path / target, kind)
    script = 'let m = load_model("have.gguf")\nprint(' + call + ")\n"
    rc, errors, err = _check(tmp_path, script, monkeypatch, capsys)
    assert (rc, errors) == (0, []), err


def test_a_taken_target_in_code_that_runs_later_fails_at_its_call(tmp_path, capsys):
    """The run checks a write target before the call does anything, at the call's position."""
    (tmp_path / "out.json").write_text("mine\n")
    script = tmp_path / "script.aner"
    script.write_text('fn save() {\n  write_json("out.json", 1)\n}\nprint("before")\nsave()\n')
    assert main(["run", str(script)]) == 1
    captured = capsys.readouterr()
    assert captured.out == "before\n"
    assert re.search(
        r"script\.aner:2:3: error\[E-FILE-EXISTS\]: .*out\.json: already exists", captured.err
    )
    assert (tmp_path / "out.json").read_text() == "mine\n"


# ---- the examples ------------------------------------------------------------------------------


@pytest.mark.parametrize("example", sorted(EXAMPLES.glob("*.aner")), ids=lambda p: p.name)
def test_every_example_passes_the_checks_before_a_run_without_a_gpu(example, monkeypatch):
    monkeypatch.setattr(gpus, "detect", lambda: ())
    analysis = check_before_run(example.read_text(), str(example), running=False)
    assert not analysis.errors, analysis.errors

"""The server publishes what `aner check` prints for a file, its file checks included (a missing
data file, a malformed JSONL file, a missing model), with those checks run after the typing-time
diagnostics, moved through edits until they run again, and run again on save
(aner_lsp/file_checks.py, aner_lsp/features/diagnostics.py)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest
from lsp_helpers import open_doc, publications
from lsprotocol import types
from pytest_lsp import LanguageClient

pytestmark = pytest.mark.asyncio(loop_scope="module")

ROOT = Path(__file__).resolve().parents[2]
HEADER = re.compile(
    r"^(?P<path>.+):(?P<line>\d+):(?P<col>\d+): (?P<severity>\w+)\[(?P<code>[\w-]+)\]: (?P<message>.*)$"
)
NOTE = "  = note: "
SEVERITY = {types.DiagnosticSeverity.Error: "error", types.DiagnosticSeverity.Warning: "warning"}

Row = tuple[int, int, str, str, str, tuple[str, ...]]
"""(line, column, severity, code, message, notes) of one diagnostic, as `aner check` prints it."""


def aner_check(path: Path) -> list[Row]:
    """The diagnostics `aner check` prints for `path` (run as a command)."""
    out = subprocess.run(
        [sys.executable, "-m", "aner_lang.cli", "check", str(path)],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
    ).stderr
    rows: list[Row] = []
    for line in out.splitlines():
        if (m := HEADER.match(line)) is not None:
            assert m["path"] == str(path), line  # only the file's own diagnostics here
            where = (int(m["line"]), int(m["col"]), m["severity"], m["code"], m["message"])
            rows.append((*where, ()))
        elif line.startswith(NOTE):
            *head, notes = rows[-1]
            rows[-1] = (*head, (*notes, line.removeprefix(NOTE)))  # type: ignore[assignment]
    return rows


def rows(found: object) -> list[Row]:
    """The server's diagnostics in the same form (its message is the message, then the notes)."""
    assert isinstance(found, list | tuple)
    out: list[Row] = []
    for d in found:
        message, *notes = d.message.split("\n")
        start = d.range.start
        out.append(
            (
                start.line + 1,
                start.character + 1,
                SEVERITY[d.severity],
                d.code,
                message,
                tuple(notes),
            )
        )
    return out


def _write(tmp_path: Path, text: str) -> Path:
    (tmp_path / "bad.jsonl").write_text('{"text": "a"}\n{"text": "b"\n', encoding="utf-8")
    (tmp_path / "good.jsonl").write_text('{"text": "a"}\n', encoding="utf-8")
    script = tmp_path / "script.aner"
    script.write_text(text, encoding="utf-8")
    return script


CASES = {
    "missing data file": 'let d = load_jsonl("absent.jsonl", field: "text")\nprint(d)\n',
    "malformed JSONL": 'let d = load_jsonl("bad.jsonl", field: "text")\nprint(d)\n',
    "missing model": 'let m = load_model("models/absent.gguf")\nprint(model_info(m).device)\n',
    "all three": (
        'let m = load_model("absent.gguf")\nlet d = load_jsonl("absent.jsonl", field: "text")\n'
        'let e = load_jsonl("bad.jsonl", field: "text")\nprint(d)\nprint(e)\n'
    ),
}


@pytest.mark.parametrize("case", CASES)
async def test_the_server_publishes_what_aner_check_prints(client: LanguageClient, tmp_path, case):
    script = _write(tmp_path, CASES[case])
    expected = aner_check(script)
    assert any(r[3] in ("E-FILE-MISSING", "E-DATA-JSON", "E-GGUF-NOT-FOUND") for r in expected)
    found = await open_doc(client, script.as_uri(), script.read_text(encoding="utf-8"))
    assert rows(found) == expected


async def test_the_server_publishes_what_aner_check_prints_for_the_qlora_example(client):
    script = ROOT / "examples" / "qlora.aner"
    found = await open_doc(client, script.as_uri(), script.read_text(encoding="utf-8"))
    assert rows(found) == aner_check(script)


def _change(client: LanguageClient, uri: str, version: int, text: str) -> None:
    client.text_document_did_change(
        types.DidChangeTextDocumentParams(
            types.VersionedTextDocumentIdentifier(uri=uri, version=version),
            [types.TextDocumentContentChangeWholeDocument(text=text)],
        )
    )


async def test_an_edit_gets_its_file_checks_after_its_typing_time_diagnostics(client, tmp_path):
    """The first publication of an edit is the analysis (the new path is not checked yet, the
    old check's diagnostic is moved down with the line above it); the second is all of it."""
    text = 'let d = load_jsonl("bad.jsonl", field: "text")\nprint(d)\n'
    script = _write(tmp_path, text)
    uri = script.as_uri()
    published = publications(client)
    (before,) = rows(await open_doc(client, uri, text))
    assert before[:4] == (1, 20, "error", "E-DATA-JSON")
    text2 = 'let m = load_model("absent.gguf")\nprint(model_info(m).device)\n' + text
    count = published.counts[uri]
    _change(client, uri, 2, text2)
    typed = rows(await published.after(uri, count + 1))
    assert [(r[0], r[3]) for r in typed] == [(3, "E-DATA-JSON")]
    whole = rows(await published.after(uri, count + 2))
    script.write_text(text2, encoding="utf-8")
    assert whole == aner_check(script)
    assert {r[3] for r in whole} == {"E-GGUF-NOT-FOUND", "E-DATA-JSON"}


async def _opened(client: LanguageClient, tmp_path: Path, text: str, code: str) -> tuple[str, int]:
    """Open `text` as a script in `tmp_path` with one diagnostic, `code`: its URI and the number
    of its publications so far."""
    uri = _write(tmp_path, text).as_uri()
    assert [r[3] for r in rows(await open_doc(client, uri, text))] == [code]
    return uri, publications(client).counts[uri]


async def test_an_edit_inside_a_checked_path_drops_its_old_diagnostic_at_once(client, tmp_path):
    text = 'let d = load_jsonl("bad.jsonl", field: "text")\nprint(d)\n'
    uri, count = await _opened(client, tmp_path, text, "E-DATA-JSON")
    published = publications(client)
    _change(client, uri, 2, text.replace("bad.jsonl", "good.jsonl"))
    assert not await published.after(uri, count + 1)  # the analysis: nothing carried over
    assert not await published.after(uri, count + 2)  # the checks: good.jsonl is good


async def test_saving_checks_the_files_again(client, tmp_path):
    """The data file appears on disk: saving the buffer checks again and the error goes."""
    text = 'let d = load_jsonl("later.jsonl", field: "text")\nprint(d)\n'
    uri, count = await _opened(client, tmp_path, text, "E-FILE-MISSING")
    (tmp_path / "later.jsonl").write_text('{"text": "x"}\n', encoding="utf-8")
    client.text_document_did_save(
        types.DidSaveTextDocumentParams(types.TextDocumentIdentifier(uri=uri))
    )
    assert not await publications(client).after(uri, count + 2)
    assert aner_check(tmp_path / "script.aner") == []


async def test_an_untitled_buffer_gets_no_file_checks(client):
    """No folder for its paths to be relative to: only what the text itself tells."""
    text = 'let d = load_jsonl("absent.jsonl", field: "text")\nprint(d)\n'
    assert not await open_doc(client, "untitled:Untitled-1", text)

"""The server answers every request and survives what a broken or hostile client sends: bad
framing, bodies that are not JSON, malformed parameters, oversized frames, bad rename targets,
imports of pipes and devices (aner_lsp/transport.py)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from wire import Wire, frame, notify, request


@pytest.fixture
def wire():  # type: ignore[no-untyped-def]
    w = Wire()
    yield w
    w.close()


def _open(wire: Wire, uri: str, text: str) -> None:
    item = {"uri": uri, "languageId": "aner", "version": 1, "text": text}
    wire.send(frame(notify("textDocument/didOpen", {"textDocument": item})))


def _hover(msg_id: int, uri: str, line: int = 0, character: int = 4) -> bytes:
    position = {"line": line, "character": character}
    return frame(
        request(msg_id, "textDocument/hover", {"textDocument": {"uri": uri}, "position": position})
    )


def test_garbage_and_bad_frames_are_skipped_and_the_next_request_answered(wire, tmp_path):
    uri = (tmp_path / "a.aner").as_uri()
    _open(wire, uri, "let x = 1\nprint(x)\n")
    wire.send(b"garbage without a newline")
    wire.send(b"Content-Length: 5\r\n\r\n{not}")  # not JSON
    wire.send(b"Content-Length: 3\r\n\r\n[1]")  # JSON, not JSON-RPC
    wire.send(b"Content-Length: 0\r\n\r\n")  # empty
    wire.send(b"junk\r\nX-Other: 1\r\n")
    wire.send(_hover(1, uri))
    assert "x" in str(wire.reply(1)["result"])


@pytest.mark.parametrize(
    "params",
    [
        b'{"deep": ' + b"[" * 100_000 + b"]" * 100_000 + b"}",  # past the recursion limit
        b'{"big": ' + b"9" * 5000 + b"}",  # an integer too long to convert
        b'{"not json"',
    ],
    ids=["deep", "long-integer", "truncated"],
)
def test_a_body_that_is_no_bounded_json_gets_a_parse_error_reply(wire, tmp_path, params):
    body = b'{"jsonrpc": "2.0", "id": 3, "method": "textDocument/hover", "params": ' + params + b"}"
    wire.send(b"Content-Length: %d\r\n\r\n%s" % (len(body), body))
    error = wire.reply(None)
    assert error["error"]["code"] == -32700 and "not JSON" in error["error"]["message"]
    uri = (tmp_path / "a.aner").as_uri()
    _open(wire, uri, "let x = 1\nprint(x)\n")
    wire.send(_hover(8, uri))  # the server goes on
    assert "x" in str(wire.reply(8)["result"])


def test_malformed_parameters_get_an_error_reply(wire, tmp_path):
    wire.send(frame(request(2, "textDocument/hover", {"textDocument": 5, "position": "x"})))
    error = wire.reply(2)["error"]
    assert error["code"] == -32602 and "data" not in error


def test_requests_about_unopened_files_are_refused_without_reading_them(wire, tmp_path):
    for msg_id, uri in enumerate([(tmp_path / "never-opened.aner").as_uri(), "file:///dev/zero"]):
        wire.send(_hover(msg_id + 10, uri))
        error = wire.reply(msg_id + 10)["error"]
        assert error["code"] == -32602 and "is not open" in error["message"]


@pytest.mark.parametrize("name", ["let", "1 bad", "", "a-b", "fn"])
def test_rename_to_a_name_the_language_refuses_is_an_error(wire, tmp_path, name):
    uri = (tmp_path / "r.aner").as_uri()
    _open(wire, uri, "let x = 1\nprint(x)\n")
    params = {"textDocument": {"uri": uri}, "position": {"line": 0, "character": 4}}
    wire.send(frame(request(4, "textDocument/rename", {**params, "newName": name})))
    assert wire.reply(4)["error"]["code"] == -32602
    wire.send(frame(request(5, "textDocument/rename", {**params, "newName": "y"})))
    assert wire.reply(5)["result"]["changes"][uri][0]["newText"] == "y"


def test_importing_a_pipe_or_a_device_does_not_hang_the_server(wire, tmp_path):
    os.mkfifo(tmp_path / "pipe.aner")
    uri = (tmp_path / "i.aner").as_uri()
    _open(wire, uri, 'import "pipe.aner"\nimport "/dev/urandom"\nlet x = 1\n')
    wire.send(_hover(6, uri, line=2))
    assert "x" in str(wire.reply(6)["result"])


def test_an_oversized_frame_ends_the_server_with_a_log_line(tmp_path):
    w = Wire()
    w.send(b"Content-Length: 1000000000000\r\n\r\n")
    assert w.proc.wait(timeout=60) == 1
    _, log = w.close()
    assert "exceeds" in log and "limit" in log


def test_import_path_completion_does_not_browse_the_file_system(wire, tmp_path):
    uri = (tmp_path / "c.aner").as_uri()
    text = 'import "/'
    _open(wire, uri, text)
    position = {"line": 0, "character": len(text)}
    wire.send(
        frame(
            request(
                7, "textDocument/completion", {"textDocument": {"uri": uri}, "position": position}
            )
        )
    )
    assert wire.reply(7)["result"]["items"] == []


def test_a_buffer_over_the_analysis_bound_gets_one_diagnostic(tmp_path):
    from aner_lsp.documents import ANALYSIS_LIMIT, AnerServer

    uri = (tmp_path / "big.aner").as_uri()
    snap = AnerServer().analyse(uri, "let x = 1\n" * (ANALYSIS_LIMIT // 10 + 1), 1)
    assert [d.code for d in snap.analysis.diagnostics] == ["E-FILE-TOO-LARGE"]
    assert Path(snap.analysis.path or "").name == "big.aner"

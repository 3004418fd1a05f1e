"""A failure of the server itself reaches the client as one clear line, never as a Python
traceback, whatever failed: a request handler (plain or async: the error reply), a notification
handler, a background update of a buffer's diagnostics (a `window/showMessage`), the file checks
(given up at their time bound, or failing: a `window/logMessage`). The traceback goes to the
server's log (aner_lsp/transport.py, aner_lsp/file_checks.py)."""

from __future__ import annotations

import asyncio
import json
import threading
from typing import Any

import pytest
from lsprotocol import types

from aner_lsp import file_checks
from aner_lsp.documents import AnerServer
from aner_lsp.features import diagnostics

TRACEBACK_MARKS = ("Traceback", 'File "', "failing_handler", "second line")


class _Capture:
    """A writer keeping every message the server sends, decoded."""

    def __init__(self) -> None:
        self.sent: list[dict[str, Any]] = []

    def write(self, data: bytes) -> None:
        self.sent.append(json.loads(data.split(b"\r\n\r\n", 1)[1]))


def _server() -> tuple[AnerServer, _Capture]:
    server = AnerServer()
    out = _Capture()
    server.protocol.set_writer(out)
    return server, out


def _deliver(server: AnerServer, message: dict[str, Any]) -> None:
    body = json.dumps({"jsonrpc": "2.0", **message})
    server.protocol.handle_message(json.loads(body, object_hook=server.protocol.structure_message))


async def _until(out: _Capture, found: Any, count: int = 1) -> dict[str, Any]:
    """The `count`-th message sent that `found` accepts (the loop runs the server's tasks
    meanwhile; a minute without it fails the test)."""
    for _ in range(6000):
        matches = [m for m in out.sent if found(m)]
        if len(matches) >= count:
            return matches[count - 1]
        await asyncio.sleep(0.01)
    raise AssertionError(f"not sent: {out.sent}")


def _published(message: dict[str, Any]) -> bool:
    return message.get("method") == types.TEXT_DOCUMENT_PUBLISH_DIAGNOSTICS


def _failing_handler(*args: Any, **kwargs: Any) -> None:
    def failing_handler() -> None:
        raise ValueError("boom\nsecond line")

    failing_handler()


async def _failing_async(*args: Any) -> None:
    _failing_handler()


def _clean(out: _Capture) -> None:
    """Nothing the server sent carries a traceback or `data`."""
    text = json.dumps(out.sent)
    assert not any(mark in text for mark in TRACEBACK_MARKS), text
    assert all("data" not in m.get("error", {}) for m in out.sent)


@pytest.mark.parametrize("handler", [_failing_handler, _failing_async], ids=["plain", "async"])
def test_a_failing_request_gets_a_clear_error_reply(handler, caplog):
    async def main() -> dict[str, Any]:
        server, out = _server()
        server.feature("aner/probe")(handler)
        _deliver(server, {"id": 1, "method": "aner/probe", "params": {}})
        reply = await _until(out, lambda m: m.get("id") == 1)
        _clean(out)
        return reply

    error = asyncio.run(main())["error"]
    assert error["code"] == -32603
    assert "failed to answer a request: ValueError: boom (a bug in the server" in error["message"]
    assert "failing_handler" in caplog.text  # the traceback is in the server's log


def _shown(start: Any) -> str:
    """The message shown after `start(server)` (the server's one line about a failure)."""

    async def main() -> dict[str, Any]:
        server, out = _server()
        start(server)
        shown = await _until(out, lambda m: m.get("method") == types.WINDOW_SHOW_MESSAGE)
        _clean(out)
        return shown

    return str(asyncio.run(main())["params"]["message"])


@pytest.mark.parametrize("handler", [_failing_handler, _failing_async], ids=["plain", "async"])
def test_a_failing_notification_is_shown_as_one_clear_line(handler, caplog):
    def start(server: AnerServer) -> None:
        server.feature("aner/told")(handler)
        _deliver(server, {"method": "aner/told", "params": {}})

    message = _shown(start)
    assert "failed to handle a notification: ValueError: boom (a bug in the server" in message
    assert "failing_handler" in caplog.text


def _open(server: AnerServer, uri: str, text: str) -> None:
    init = {"processId": None, "rootUri": None, "capabilities": {}}
    _deliver(server, {"id": 0, "method": "initialize", "params": init})
    item = {"uri": uri, "languageId": "aner", "version": 1, "text": text}
    _deliver(server, {"method": "textDocument/didOpen", "params": {"textDocument": item}})


def test_a_failing_diagnostics_update_is_shown_as_one_clear_line(tmp_path, caplog):
    def start(server: AnerServer) -> None:
        diagnostics.register(server)
        server.analyse = _failing_handler  # type: ignore[assignment,method-assign]
        _open(server, (tmp_path / "a.aner").as_uri(), "let x = 1\n")

    message = _shown(start)
    assert "failed to update the diagnostics of a buffer: ValueError: boom" in message
    assert "failing_handler" in caplog.text


def _checked(tmp_path, busy: threading.Event | None = None) -> tuple[list[str], str]:
    """Open a script that reads a missing file (the file checks' worker kept busy until `busy`
    is set, if given): the codes of the second publication (the whole one) and the log line."""

    async def main() -> tuple[list[str], str]:
        server, out = _server()
        diagnostics.register(server)
        if busy is not None:
            server.file_checks.submit(busy.wait, 60)
        _open(server, (tmp_path / "a.aner").as_uri(), SCRIPT)
        logged = await _until(out, lambda m: m.get("method") == types.WINDOW_LOG_MESSAGE)
        whole = await _until(out, _published, 2)
        if busy is not None:
            busy.set()
        _clean(out)
        return [d["code"] for d in whole["params"]["diagnostics"]], logged["params"]["message"]

    return asyncio.run(main())


SCRIPT = 'let d = load_jsonl("absent.jsonl", field: "text")\nprint(d)\n'


def test_file_checks_over_their_time_bound_are_given_up_and_logged(tmp_path, monkeypatch):
    monkeypatch.setattr(file_checks, "TIME_LIMIT_S", 0.05)
    codes, logged = _checked(tmp_path, threading.Event())
    assert codes == []  # E-FILE-MISSING once the checks run: see test_file_checks.py
    assert "checking the files it reads took over 0.05 s" in logged and "a.aner" in logged


def test_failing_file_checks_are_logged_as_one_clear_line(tmp_path, monkeypatch, caplog):
    from aner_lang.check import surroundings

    monkeypatch.setattr(surroundings, "surroundings", _failing_handler)
    codes, logged = _checked(tmp_path)
    assert codes == []
    assert "failed to check the files" in logged and "ValueError: boom (a bug" in logged
    assert "failing_handler" in caplog.text


def test_file_checks_run_without_a_bound_find_the_missing_file(tmp_path):
    """The control for the two tests above: the same script, checked as usual."""

    async def main() -> list[str]:
        server, out = _server()
        diagnostics.register(server)
        _open(server, (tmp_path / "a.aner").as_uri(), SCRIPT)
        whole = await _until(out, _published, 2)
        return [d["code"] for d in whole["params"]["diagnostics"]]

    assert asyncio.run(main()) == ["E-FILE-MISSING"]

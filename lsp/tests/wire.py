"""A language server in a child process spoken to byte by byte: for tests of what arrives on the
wire (bad framing, oversized or malformed messages), which a well-behaved client never sends."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from pathlib import Path
from queue import Empty, Queue
from typing import Any

LSP_ROOT = Path(__file__).resolve().parents[1]


def frame(message: dict[str, Any] | bytes) -> bytes:
    body = message if isinstance(message, bytes) else json.dumps(message).encode()
    return b"Content-Length: %d\r\n\r\n" % len(body) + body


def request(msg_id: int, method: str, params: Any) -> dict[str, Any]:
    return {"jsonrpc": "2.0", "id": msg_id, "method": method, "params": params}


def notify(method: str, params: Any) -> dict[str, Any]:
    return {"jsonrpc": "2.0", "method": method, "params": params}


INITIALIZE = request(0, "initialize", {"processId": None, "rootUri": None, "capabilities": {}})


class Wire:
    """`python -m aner_lsp.server` with raw stdin; replies parsed as they come."""

    def __init__(self) -> None:
        env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(LSP_ROOT.parent), str(LSP_ROOT)])}
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "aner_lsp.server"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env=env,
        )
        self.replies: Queue[dict[str, Any]] = Queue()
        self.log: list[bytes] = []
        threading.Thread(target=self._read, daemon=True).start()
        self._drainer = threading.Thread(target=self._drain, daemon=True)
        self._drainer.start()  # a full stderr pipe would block the server
        self.send(frame(INITIALIZE))
        assert "result" in self.reply(0)
        self.send(frame(notify("initialized", {})))

    def _read(self) -> None:
        out = self.proc.stdout
        assert out is not None
        while True:
            line = out.readline()
            if not line:
                return
            if line.lower().startswith(b"content-length:"):
                length = int(line.split(b":")[1])
                while out.readline().strip():  # the other headers, up to the blank line
                    pass
                self.replies.put(json.loads(out.read(length)))

    def _drain(self) -> None:
        assert self.proc.stderr is not None
        for line in self.proc.stderr:
            self.log.append(line)
            del self.log[:-200]

    def send(self, data: bytes) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(data)
        self.proc.stdin.flush()

    def reply(self, msg_id: int | None, timeout: float = 60) -> dict[str, Any]:
        """The reply to request `msg_id` (notifications and other replies are skipped); None:
        the reply to a message whose id could not be read."""
        while True:
            try:
                message = self.replies.get(timeout=timeout)
            except Empty:
                raise AssertionError(f"no reply to request {msg_id}") from None
            if message.get("id") == msg_id and "method" not in message:
                return message

    def close(self) -> tuple[int, str]:
        """Stop the server; its exit code and the end of its log."""
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(timeout=30)
        self._drainer.join(timeout=30)  # the log ends with the process
        return self.proc.returncode, b"".join(self.log).decode(errors="replace")

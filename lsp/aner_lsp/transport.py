"""The server's side of the wire: framing, message size, and what an error reply may say.

pygls reads `Content-Length` frames and dispatches them; three things around it are Aner's:

* Framing is resynchronised: a header is found at the end of a line even after garbage (a body
  shorter or longer than its `Content-Length` leaves bytes in front of the next header). A body
  is parsed by `aner_lang.host.json_text.loads` (nesting and integer digits bounded); one that is not
  JSON or is past those bounds gets JSON-RPC's Parse error reply (without an id: it cannot be read)
  and a line in the log. The server keeps answering the frames after it.
* A header line is read at most `MAX_LINE_BYTES` at a time, so garbage without a newline costs
  no memory.
* A frame longer than `MAX_MESSAGE_BYTES` is never read into memory: the server logs a line and
  exits with status 1, as it cannot tell where the next frame starts without reading the whole
  body (the exit is immediate: the thread blocked reading stdin is not waited for).
* Every request gets an answer: one whose parameters do not fit the method's schema gets an
  InvalidParams error (pygls would log and drop it).
* Nothing sent to the client carries a Python traceback: a failure of the server itself (a
  request handler's, a notification handler's, a background task's) reaches the client as one
  line (`failure_message`: what failed, the error's first line, that it is a bug whose details are
  in the server's log) in the error reply, or, where there is no reply, in a `window/showMessage`.
  pygls would put the traceback in an internal error's `data` and a notification's exception text
  in a message; the traceback goes to the server's log (stderr) instead.
"""

from __future__ import annotations

import asyncio
import logging
import os
import re
import threading
import traceback
from typing import TYPE_CHECKING, Any

from lsprotocol import types as lsp
from lsprotocol.types import ResponseError
from pygls.exceptions import (
    FeatureRequestError,
    JsonRpcException,
    JsonRpcInternalError,
    JsonRpcInvalidParams,
    JsonRpcParseError,
)
from pygls.io_ import StdinAsyncReader
from pygls.lsp.server import LanguageServer
from pygls.protocol import LanguageServerProtocol

from aner_lang.host import json_text

if TYPE_CHECKING:
    from pygls.io_ import AsyncReader

log = logging.getLogger(__name__)

MAX_MESSAGE_BYTES = 64 << 20
"""The longest frame read: a whole 8 MiB script (`files.SCRIPT_LIMIT`) JSON-escaped fits."""
MAX_LINE_BYTES = 1 << 16
MAX_FAILURE_CHARS = 200
"""The longest error text quoted in a failure message."""
_HEADER = re.compile(rb"Content-Length: *(\d+)\r?\n\Z", re.IGNORECASE)


def failure_message(what: str, error: BaseException | str) -> str:
    """The one line the client is told when the server fails at `what` (its own bug, not the
    user's): the error's first line (with its type), bounded, and where the details are."""
    if isinstance(error, BaseException) and not isinstance(error, JsonRpcException):
        error = "".join(traceback.format_exception_only(error))
    lines = str(error).strip().splitlines() or ["no message"]
    text = lines[0][:MAX_FAILURE_CHARS]
    return (
        f"the Aner language server failed {what}: {text} (a bug in the server; its log, on "
        f"stderr, has the details)"
    )


class _Answered:
    """A request already answered with an error while it was being decoded."""

    jsonrpc = ""


class AnerProtocol(LanguageServerProtocol):
    def structure_message(self, data: dict[str, Any]) -> Any:
        try:
            return super().structure_message(data)
        except JsonRpcException as exc:
            if "id" in data and "method" in data:  # a request: it must get its answer
                self._send_response(
                    data["id"],
                    None,
                    JsonRpcInvalidParams(
                        message=f"invalid parameters for {data['method']}"
                    ).to_response_error(),
                )
                return _Answered()
            raise exc from None

    def handle_message(self, message: Any) -> None:
        if not isinstance(message, _Answered):
            super().handle_message(message)

    def _send_response(
        self, msg_id: Any, result: Any = None, error: ResponseError | None = None
    ) -> None:
        if error is not None and error.code == JsonRpcInternalError.CODE:
            error = ResponseError(error.code, failure_message("to answer a request", error.message))
        elif error is not None and error.data is not None:
            error = ResponseError(error.code, error.message)
        super()._send_response(msg_id, result, error)


async def serve(
    stop: threading.Event, reader: AsyncReader, protocol: LanguageServerProtocol
) -> bool:
    """pygls's message loop with the framing rules of the module docstring; False when it ended
    on a frame it cannot read."""
    length: int | None = None
    while not stop.is_set():
        line = await reader.readline()
        if not line:
            return True
        header = _HEADER.search(line)
        if header is not None:
            digits = header.group(1)
            length = int(digits) if len(digits) <= 18 else MAX_MESSAGE_BYTES + 1
            continue
        if line.strip() or length is None:
            continue  # another header, or garbage between frames
        if length > MAX_MESSAGE_BYTES:
            log.error(
                "a message of %d bytes exceeds the %d-byte limit; the framing cannot be "
                "recovered, exiting",
                length,
                MAX_MESSAGE_BYTES,
            )
            return False
        body = await reader.readexactly(length)
        if len(body) < length:
            return True  # the input ended inside the frame
        length = None
        try:
            message = json_text.loads(body, object_hook=protocol.structure_message)
        except ValueError as exc:  # not JSON, or past json_text's bounds
            log.error("a message that is not JSON: %s", exc)
            error = JsonRpcParseError(message=f"the message is not JSON: {exc}")
            protocol._send_response(None, None, error.to_response_error())  # type: ignore[arg-type]
            continue
        except Exception:
            log.exception("skipped a message that is not JSON-RPC")
            continue
        try:
            protocol.handle_message(message)
        except Exception:
            log.exception("failed to handle a message")
    return True


class _BoundedLines(StdinAsyncReader):
    """Header lines are read at most `MAX_LINE_BYTES` at a time: a client that sends garbage
    without a newline costs no memory (the pieces are garbage lines, skipped)."""

    def readline(self) -> Any:
        return self.loop.run_in_executor(self.executor, self.stdin.readline, MAX_LINE_BYTES)


class BoundedServer(LanguageServer):
    """A pygls server speaking `AnerProtocol`, reading stdio through `serve`."""

    def __init__(self, name: str, version: str) -> None:
        super().__init__(name, version, protocol_cls=AnerProtocol)

    def report_server_error(self, error: BaseException, source: Any) -> None:
        """A failure outside a request's reply (a notification handler's, sending a message):
        reported by `report_failure`. A request's failure is told in its error reply."""
        if source is not FeatureRequestError:
            self.report_failure("to handle a notification", error)

    def report_failure(self, what: str, error: BaseException) -> None:
        """The traceback of a failure at `what` to the log, one line (`failure_message`) to the
        user."""
        data = error.data if isinstance(error, JsonRpcException) else None
        if isinstance(data, dict) and "traceback" in data:  # pygls's, formatted
            log.error("%s\n%s", error, "".join(data["traceback"]))
        else:
            log.error("%s", error, exc_info=(type(error), error, error.__traceback__))
        self.window_show_message(
            lsp.ShowMessageParams(lsp.MessageType.Error, failure_message(what, error))
        )

    def _start_io_async(self, stdin: Any = None, stdout: Any = None) -> None:
        import sys

        from pygls.io_ import StdoutWriter

        self._stop_event = threading.Event()
        reader = _BoundedLines(stdin or sys.stdin.buffer, self.thread_pool)
        self.protocol.set_writer(StdoutWriter(stdout or sys.stdout.buffer))
        try:
            if not asyncio.run(serve(self._stop_event, reader, self.protocol)):
                logging.shutdown()
                os._exit(1)
        except BrokenPipeError:
            log.error("the connection to the client is lost; exiting")
        except (KeyboardInterrupt, SystemExit):
            pass
        finally:
            self.shutdown()  # type: ignore[no-untyped-call]

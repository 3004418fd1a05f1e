"""The file checks of an open buffer: what `aner check` adds to `analyze` (the files the script
reads, the machine, this installation), run for the editor through the same function,
`aner_lang.check.surroundings.surroundings`, so both report the same diagnostics.

Rules, and why:

* They run after the analysis, on one worker thread of their own (`AnerServer.file_checks`): they
  touch the disk, which may be slow, and must never delay the typing-time diagnostics or an
  answer. A check whose text is no longer the buffer's when the worker gets to it is skipped.
* They are bounded: every read is (the byte and row limits of the checks themselves), and the wait
  for all of them is `TIME_LIMIT_S`. A check over it is given up (its thread ends on its own, its
  result unused) and the client's log says so; the buffer then shows the analysis' diagnostics.
* Paths are relative to the buffer's folder, as `aner check` takes them relative to the script's;
  a buffer that is no file (an untitled one) has no folder, and is not checked.
* Until the current text is checked, the last check's diagnostics are shown where they were,
  moved with the edits since; one whose text an edit touched is dropped (`stale.Edit`).
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from lsprotocol import types as lsp

from aner_lsp.stale import Edit
from aner_lsp.transport import failure_message

if TYPE_CHECKING:
    from aner_lang.check.analysis import Analysis
    from aner_lang.problems.diagnostics import Diagnostic
    from aner_lsp.documents import AnerServer, Snapshot

log = logging.getLogger(__name__)

TIME_LIMIT_S = 10.0
"""The longest wait for one buffer's file checks."""


@dataclass(frozen=True)
class Checked:
    """The file checks' diagnostics of one text of a buffer."""

    source: str
    diagnostics: tuple[Diagnostic, ...] = ()

    def seen_in(self, source: str) -> list[Diagnostic]:
        """These diagnostics in `source`, a later text of the buffer (see the module's rules)."""
        if source == self.source:
            return list(self.diagnostics)
        edit = Edit(self.source, source)
        moved = [(d, edit.span_to_new(d.span)) for d in self.diagnostics if d.span is not None]
        return [replace(d, span=span) for d, span in moved if span is not None]


def _run(ls: AnerServer, uri: str, analysis: Analysis, version: int | None) -> Checked | None:
    """The checks of `analysis` (on the worker thread); None if the buffer has moved on."""
    from aner_lang.check.surroundings import surroundings

    doc = ls.workspace.text_documents.get(uri)
    if doc is None or doc.version != version:
        return None
    return Checked(analysis.source, tuple(surroundings(analysis, before_running=False)))


async def check(ls: AnerServer, uri: str, snap: Snapshot) -> Checked | None:
    """The file checks of a snapshot: None when the buffer moved on before they ran; no
    diagnostics for a buffer that is no file, or when the checks fail or run over the limit (the
    client's log says which)."""
    analysis = snap.analysis
    if analysis.path is None:
        return Checked(analysis.source)
    future = ls.file_checks.submit(_run, ls, uri, analysis, snap.version)
    try:
        return await asyncio.wait_for(asyncio.wrap_future(future), TIME_LIMIT_S)
    except TimeoutError:
        message = (
            f"{analysis.path}: checking the files it reads took over {TIME_LIMIT_S:g} s; the "
            f"editor shows no file checks for this version (`aner check` runs them unbounded)"
        )
    except Exception as e:
        log.exception("the file checks of %s failed", analysis.path)
        message = failure_message(f"to check the files {analysis.path} reads", e)
    ls.window_log_message(lsp.LogMessageParams(lsp.MessageType.Warning, message))
    return Checked(analysis.source)

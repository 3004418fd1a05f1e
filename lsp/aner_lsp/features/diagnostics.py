"""Diagnostics: what `aner check` reports for a buffer, published on open, after edits and on save.

Each change is handled in two steps, neither on the request loop:

1. the analysis (parse, names, types), `DEBOUNCE_S` after typing pauses (on open and on save at
   once), on a worker thread. Its diagnostics are published as soon as it is done, with the last
   file checks' moved through the edits since (`file_checks.Checked.seen_in`);
2. the file checks (`file_checks`: the files the script reads, the machine, this installation),
   `CHECK_PAUSE_S` after the change (on open and on save at once). Everything is published again
   when they are done: the diagnostics `aner check` prints for the file, in its order.

So each version analysed is published twice, the second time whole. A newer change cancels both
steps of an older one, and nothing computed from a text that is no longer the buffer's is
published. Diagnostics of imported files are left to those files (they are published when open).
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable
from functools import partial
from typing import TYPE_CHECKING

from lsprotocol import types as lsp

from aner_lsp import file_checks
from aner_lsp.documents import AnerServer, Snapshot

if TYPE_CHECKING:
    from aner_lang.check.analysis import Analysis
    from aner_lang.grammar.ast import Span
    from aner_lang.problems.diagnostics import Diagnostic
    from aner_lsp.positions import LineIndex

DEBOUNCE_S = 0.15
"""Edits closer together than this are analysed once (typing does not queue analyses)."""
CHECK_PAUSE_S = 0.5
"""The file checks of an edit wait this long after it (they read the disk: typing does not queue
them, and the typing-time diagnostics come first)."""

_SEVERITY = {"error": lsp.DiagnosticSeverity.Error, "warning": lsp.DiagnosticSeverity.Warning}


def _own(found: Iterable[Diagnostic], path: str | None) -> list[tuple[Diagnostic, Span]]:
    return [(d, d.span) for d in found if d.path in (None, path) and d.span is not None]


def own_diagnostics(analysis: Analysis) -> list[tuple[Diagnostic, Span]]:
    """The diagnostics that belong to this file and have a place in it, with that place
    (imported files report their own)."""
    return _own(analysis.diagnostics, analysis.path)


def to_lsp(d: Diagnostic, span: Span, index: LineIndex) -> lsp.Diagnostic:
    """One checker diagnostic as the protocol's, its notes and suggestion added to the message."""
    message = d.message + "".join(f"\n{n}" for n in d.notes)
    if d.suggestion:
        message += f"\nsuggestion: {d.suggestion}"
    return lsp.Diagnostic(
        range=index.span_range(span),
        message=message,
        code=d.code,
        severity=_SEVERITY.get(d.severity, lsp.DiagnosticSeverity.Information),
        source="aner",
    )


def diagnostics(
    analysis: Analysis, index: LineIndex, checked: Iterable[Diagnostic] = ()
) -> list[lsp.Diagnostic]:
    """The analysis' diagnostics of this file, then the file checks' (`aner check`'s order)."""
    found = _own([*analysis.diagnostics, *checked], analysis.path)
    return [to_lsp(d, span, index) for d, span in found]


def _publish(ls: AnerServer, uri: str, snap: Snapshot) -> None:
    last = ls.checked.get(uri)
    checked = last.seen_in(snap.analysis.source) if last is not None else []
    ls.text_document_publish_diagnostics(
        lsp.PublishDiagnosticsParams(
            uri=uri,
            version=snap.version,
            diagnostics=diagnostics(snap.analysis, snap.index, checked),
        )
    )


def _current(ls: AnerServer, uri: str, snap: Snapshot) -> bool:
    doc = ls.workspace.text_documents.get(uri)
    return doc is not None and doc.version == snap.version


def _schedule(ls: AnerServer, uri: str, pause: float, check_pause: float) -> None:
    """Start updating the diagnostics of `uri` (see the module's steps), cancelling an update
    still under way."""
    previous = ls.pending.pop(uri, None)
    if previous is not None:
        previous.cancel()
    task = asyncio.ensure_future(_update(ls, uri, pause, check_pause))
    task.add_done_callback(partial(_done, ls, uri))
    ls.pending[uri] = task


def _done(ls: AnerServer, uri: str, task: asyncio.Task[None]) -> None:
    if ls.pending.get(uri) is task:
        del ls.pending[uri]
    if not task.cancelled() and (error := task.exception()) is not None:
        ls.report_failure("to update the diagnostics of a buffer", error)


async def _update(ls: AnerServer, uri: str, pause: float, check_pause: float) -> None:
    """Analyse the buffer once edits pause and publish, then check its files and publish."""
    loop = asyncio.get_running_loop()
    checks_due = loop.time() + check_pause
    await asyncio.sleep(pause)
    doc = ls.workspace.text_documents.get(uri)
    if doc is None:
        return
    snap = ls.snapshots.get(uri)
    if snap is None or snap.version != doc.version or snap.analysis.source != doc.source:
        snap = await loop.run_in_executor(None, ls.analyse, uri, doc.source, doc.version)
        if not _current(ls, uri, snap):
            return  # edited meanwhile: the newer edit's update publishes
        ls.snapshots[uri] = snap
    _publish(ls, uri, snap)
    await asyncio.sleep(max(0.0, checks_due - loop.time()))
    checked = await file_checks.check(ls, uri, snap)
    if checked is None or not _current(ls, uri, snap):
        return
    ls.checked[uri] = checked
    _publish(ls, uri, snap)


async def did_open(ls: AnerServer, params: lsp.DidOpenTextDocumentParams) -> None:
    _schedule(ls, params.text_document.uri, 0.0, 0.0)


async def did_change(ls: AnerServer, params: lsp.DidChangeTextDocumentParams) -> None:
    _schedule(ls, params.text_document.uri, DEBOUNCE_S, CHECK_PAUSE_S)


async def did_save(ls: AnerServer, params: lsp.DidSaveTextDocumentParams) -> None:
    """The files may have changed with the buffer's: check again at once."""
    _schedule(ls, params.text_document.uri, 0.0, 0.0)


def did_close(ls: AnerServer, params: lsp.DidCloseTextDocumentParams) -> None:
    uri = params.text_document.uri
    ls.snapshots.pop(uri, None)
    ls.checked.pop(uri, None)
    task = ls.pending.pop(uri, None)
    if task is not None:
        task.cancel()
    ls.text_document_publish_diagnostics(lsp.PublishDiagnosticsParams(uri=uri, diagnostics=[]))


def register(server: AnerServer) -> None:
    server.feature(lsp.TEXT_DOCUMENT_DID_OPEN)(did_open)
    server.feature(lsp.TEXT_DOCUMENT_DID_CHANGE)(did_change)
    server.feature(lsp.TEXT_DOCUMENT_DID_SAVE, lsp.SaveOptions(include_text=False))(did_save)
    server.feature(lsp.TEXT_DOCUMENT_DID_CLOSE)(did_close)

"""Diagnostics: the checker's diagnostics of a buffer, published on open and after edits.

An edit is analysed in the background, `DEBOUNCE_S` after typing pauses, on a worker thread (the
analysis of a long file takes most of a second; the request loop stays free meanwhile); its
diagnostics are published when that analysis is done, unless the buffer changed again."""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING

from lsprotocol import types as lsp

from aner_lsp.documents import AnerServer, Snapshot

if TYPE_CHECKING:
    from aner_lang.check.analysis import Analysis
    from aner_lang.diagnostics import Diagnostic
    from aner_lang.grammar.ast import Span
    from aner_lsp.positions import LineIndex

DEBOUNCE_S = 0.15
"""Edits closer together than this are analysed once (typing does not queue analyses)."""

_SEVERITY = {"error": lsp.DiagnosticSeverity.Error, "warning": lsp.DiagnosticSeverity.Warning}


def own_diagnostics(analysis: Analysis) -> list[tuple[Diagnostic, Span]]:
    """The diagnostics that belong to this file and have a place in it, with that place
    (imported files report their own)."""
    return [
        (d, d.span)
        for d in analysis.diagnostics
        if d.path in (None, analysis.path) and d.span is not None
    ]


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


def diagnostics(analysis: Analysis, index: LineIndex) -> list[lsp.Diagnostic]:
    return [to_lsp(d, span, index) for d, span in own_diagnostics(analysis)]


def _publish(ls: AnerServer, uri: str, snap: Snapshot) -> None:
    ls.text_document_publish_diagnostics(
        lsp.PublishDiagnosticsParams(
            uri=uri, version=snap.version, diagnostics=diagnostics(snap.analysis, snap.index)
        )
    )


async def did_open(ls: AnerServer, params: lsp.DidOpenTextDocumentParams) -> None:
    """Analyse the opened buffer on a worker thread (as an edit is), then publish."""
    uri = params.text_document.uri
    ls.pending[uri] = asyncio.ensure_future(_analyse_later(ls, uri, 0.0))


async def did_change(ls: AnerServer, params: lsp.DidChangeTextDocumentParams) -> None:
    uri = params.text_document.uri
    previous = ls.pending.pop(uri, None)
    if previous is not None:
        previous.cancel()
    ls.pending[uri] = asyncio.ensure_future(_analyse_later(ls, uri))


async def _analyse_later(ls: AnerServer, uri: str, pause: float = DEBOUNCE_S) -> None:
    """Analyse the buffer on a worker thread once edits pause, then publish its diagnostics."""
    await asyncio.sleep(pause)
    doc = ls.workspace.text_documents.get(uri)
    if doc is None:
        return
    snap = await asyncio.get_running_loop().run_in_executor(
        None, ls.analyse, uri, doc.source, doc.version
    )
    current = ls.workspace.text_documents.get(uri)
    if current is None or current.version != snap.version:
        return  # edited meanwhile: the newer edit's task publishes
    ls.snapshots[uri] = snap
    ls.pending.pop(uri, None)
    _publish(ls, uri, snap)


def did_close(ls: AnerServer, params: lsp.DidCloseTextDocumentParams) -> None:
    uri = params.text_document.uri
    ls.snapshots.pop(uri, None)
    task = ls.pending.pop(uri, None)
    if task is not None:
        task.cancel()
    ls.text_document_publish_diagnostics(lsp.PublishDiagnosticsParams(uri=uri, diagnostics=[]))


def register(server: AnerServer) -> None:
    server.feature(lsp.TEXT_DOCUMENT_DID_OPEN)(did_open)
    server.feature(lsp.TEXT_DOCUMENT_DID_CHANGE)(did_change)
    server.feature(lsp.TEXT_DOCUMENT_DID_CLOSE)(did_close)

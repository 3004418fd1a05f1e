"""The pygls wiring: keeps one `Analysis` per open document (re-analysed from the live buffer on
open and change, imports resolved from open buffers first) and routes each request to the pure
function in `features`. Run with `aner lsp` or `python -m aner_lsp.server` (stdio)."""

from __future__ import annotations

import asyncio
import os
import sys
from dataclasses import dataclass
from typing import TYPE_CHECKING

from lsprotocol import types as lsp
from pygls.lsp.server import LanguageServer
from pygls.uris import from_fs_path, to_fs_path

from aner_lsp import __version__, legend
from aner_lsp.formatting import formatting_edits
from aner_lsp.positions import LineIndex
from aner_lsp.stale import ShiftedAnalysis

if TYPE_CHECKING:
    from aner_lang.check import Analysis


def _features():
    """The feature module, imported on first use: it pulls in the parser and checker (about a
    third of a second of CPU) that answering `initialize` need not wait for."""
    from aner_lsp import features

    return features


@dataclass
class Snapshot:
    """The analysis of one buffer version, with the line index of the same text."""

    analysis: Analysis
    index: LineIndex
    version: int | None


class AnerServer(LanguageServer):
    def __init__(self) -> None:
        super().__init__("aner-lsp", __version__)
        self.snapshots: dict[str, Snapshot] = {}
        self.pending: dict[str, asyncio.Task] = {}
        """The debounced background analysis of each buffer with unanalysed edits."""

    def path_of(self, uri: str) -> str | None:
        return to_fs_path(uri) if uri.startswith("file:") else None

    def resolve(self, path: str, importer: str | None) -> tuple[str, str]:
        """Imports read open editor buffers before the disk, so unsaved edits count."""
        from aner_lang.check import file_resolver

        base = os.path.dirname(importer) if importer else os.getcwd()
        resolved = os.path.normpath(os.path.join(base, path))
        doc = self.workspace.text_documents.get(from_fs_path(resolved))
        return (resolved, doc.source) if doc is not None else file_resolver(path, importer)

    def analyse(self, uri: str, source: str, version: int | None) -> Snapshot:
        """Analyse one text of the buffer (pure: safe to run on a worker thread)."""
        from aner_lang.check import analyze

        return Snapshot(
            analyze(source, self.path_of(uri), resolver=self.resolve), LineIndex(source), version
        )

    def refresh(self, uri: str) -> Snapshot:
        doc = self.workspace.get_text_document(uri)
        snap = self.analyse(uri, doc.source, doc.version)
        self.snapshots[uri] = snap
        return snap

    def live(self, uri: str) -> tuple[Analysis | ShiftedAnalysis, LineIndex]:
        """For completion and signature help: the analysis to answer from and the live text's
        index. While an edit is still being analysed, the previous analysis seen through it."""
        doc = self.workspace.get_text_document(uri)
        snap = self.snapshots.get(uri)
        if snap is None:
            snap = self.refresh(uri)
        if snap.version == doc.version and snap.analysis.source == doc.source:
            return snap.analysis, snap.index
        return ShiftedAnalysis(snap.analysis, doc.source), LineIndex(doc.source)

    def snapshot(self, uri: str) -> Snapshot:
        doc = self.workspace.get_text_document(uri)
        snap = self.snapshots.get(uri)
        return (
            snap
            if snap is not None
            and snap.version == doc.version
            and snap.analysis.source == doc.source
            else self.refresh(uri)
        )

    def index_of(self, path: str) -> LineIndex:
        uri = from_fs_path(path)
        if uri in self.snapshots:
            return self.snapshots[uri].index
        doc = self.workspace.text_documents.get(uri)
        if doc is not None:
            return LineIndex(doc.source)
        with open(path, encoding="utf-8") as f:
            return LineIndex(f.read())


server = AnerServer()


@server.feature(lsp.INITIALIZED)
def initialized(ls: AnerServer, params: lsp.InitializedParams) -> None:
    """Warm up (parser, checker, registry) once the client has its answer to `initialize`."""
    from aner_lang.builtins import registry

    _features()
    registry()


def _publish(ls: AnerServer, uri: str) -> None:
    snap = ls.refresh(uri)
    ls.text_document_publish_diagnostics(
        lsp.PublishDiagnosticsParams(
            uri=uri,
            version=snap.version,
            diagnostics=_features().diagnostics(snap.analysis, snap.index),
        )
    )


@server.feature(lsp.TEXT_DOCUMENT_DID_OPEN)
def did_open(ls: AnerServer, params: lsp.DidOpenTextDocumentParams) -> None:
    _publish(ls, params.text_document.uri)


SWITCH_INTERVAL_S = 0.0005
DEBOUNCE_S = 0.15
"""Edits closer together than this are analysed once (typing does not queue analyses)."""


@server.feature(lsp.TEXT_DOCUMENT_DID_CHANGE)
async def did_change(ls: AnerServer, params: lsp.DidChangeTextDocumentParams) -> None:
    uri = params.text_document.uri
    previous = ls.pending.pop(uri, None)
    if previous is not None:
        previous.cancel()
    ls.pending[uri] = asyncio.ensure_future(_analyse_later(ls, uri))


async def _analyse_later(ls: AnerServer, uri: str) -> None:
    """Analyse the buffer on a worker thread once edits pause, then publish its diagnostics."""
    await asyncio.sleep(DEBOUNCE_S)
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
    ls.text_document_publish_diagnostics(
        lsp.PublishDiagnosticsParams(
            uri=uri,
            version=snap.version,
            diagnostics=_features().diagnostics(snap.analysis, snap.index),
        )
    )


@server.feature(lsp.TEXT_DOCUMENT_DID_CLOSE)
def did_close(ls: AnerServer, params: lsp.DidCloseTextDocumentParams) -> None:
    ls.snapshots.pop(params.text_document.uri, None)
    task = ls.pending.pop(params.text_document.uri, None)
    if task is not None:
        task.cancel()
    ls.text_document_publish_diagnostics(
        lsp.PublishDiagnosticsParams(uri=params.text_document.uri, diagnostics=[])
    )


def _at(ls: AnerServer, params) -> tuple[Snapshot, int]:
    snap = ls.snapshot(params.text_document.uri)
    return snap, snap.index.offset(params.position)


@server.feature(
    lsp.TEXT_DOCUMENT_COMPLETION,
    lsp.CompletionOptions(trigger_characters=[".", "(", ",", ":", '"', "/"]),
)
def completion(ls: AnerServer, params: lsp.CompletionParams) -> lsp.CompletionList:
    analysis, index = ls.live(params.text_document.uri)
    path = ls.path_of(params.text_document.uri)
    items = _features().completion(
        analysis,
        index.source,
        index.offset(params.position),
        os.path.dirname(path) if path else None,
    )
    return lsp.CompletionList(is_incomplete=False, items=items)


@server.feature(
    lsp.TEXT_DOCUMENT_SIGNATURE_HELP,
    lsp.SignatureHelpOptions(trigger_characters=["(", ","], retrigger_characters=[":"]),
)
def signature_help(ls: AnerServer, params: lsp.SignatureHelpParams) -> lsp.SignatureHelp | None:
    analysis, index = ls.live(params.text_document.uri)
    return _features().signature_help(analysis, index.source, index.offset(params.position))


@server.feature(lsp.TEXT_DOCUMENT_HOVER)
def hover(ls: AnerServer, params: lsp.HoverParams) -> lsp.Hover | None:
    snap, offset = _at(ls, params)
    return _features().hover(snap.analysis, snap.index.source, offset, snap.index)


@server.feature(lsp.TEXT_DOCUMENT_DEFINITION)
def definition(ls: AnerServer, params: lsp.DefinitionParams) -> lsp.Location | None:
    snap, offset = _at(ls, params)
    return _features().definition(snap.analysis, offset, from_fs_path, ls.index_of)


@server.feature(lsp.TEXT_DOCUMENT_RENAME)
def rename(ls: AnerServer, params: lsp.RenameParams) -> lsp.WorkspaceEdit | None:
    snap, offset = _at(ls, params)
    return _features().rename(
        snap.analysis, offset, params.new_name, params.text_document.uri, snap.index
    )


@server.feature(lsp.TEXT_DOCUMENT_DOCUMENT_SYMBOL)
def document_symbols(ls: AnerServer, params: lsp.DocumentSymbolParams) -> list[lsp.DocumentSymbol]:
    snap = ls.snapshot(params.text_document.uri)
    return _features().document_symbols(snap.analysis, snap.index)


@server.feature(
    lsp.TEXT_DOCUMENT_SEMANTIC_TOKENS_FULL,
    lsp.SemanticTokensLegend(
        token_types=legend.TOKEN_TYPES, token_modifiers=legend.TOKEN_MODIFIERS
    ),
)
def semantic_tokens(ls: AnerServer, params: lsp.SemanticTokensParams) -> lsp.SemanticTokens:
    snap = ls.snapshot(params.text_document.uri)
    return _features().semantic_tokens(snap.analysis, snap.index.source, snap.index)


@server.feature(lsp.TEXT_DOCUMENT_FORMATTING)
def formatting(ls: AnerServer, params: lsp.DocumentFormattingParams) -> list[lsp.TextEdit]:
    doc = ls.workspace.get_text_document(params.text_document.uri)
    return formatting_edits(doc.source, LineIndex(doc.source))


def main() -> int:
    """Serve on stdio (what editors and `aner lsp` use). A short GIL switch interval lets the
    request loop take turns with a background analysis often (the default 5 ms per hand-off
    made a completion wait hundreds of milliseconds behind a re-analysis)."""
    sys.setswitchinterval(SWITCH_INTERVAL_S)
    server.start_io()
    return 0


if __name__ == "__main__":
    main()

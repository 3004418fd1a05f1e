"""The server object and its state: one analysis snapshot per open buffer.

Buffers are analysed from their live (unsaved) text, and imports read open buffers before the
disk. Handlers ask for a `Snapshot` of the current text (`snapshot`, analysed on demand) or, for
completion and signature help, which must not wait for an analysis, for `live`: the last analysis
seen through the edits made since (`stale.ShiftedAnalysis`).

The checker is imported inside the methods that analyse: this module is loaded before the server
answers `initialize`, and the parser and checker need not be."""

from __future__ import annotations

import asyncio
import os
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import TYPE_CHECKING

from lsprotocol import types as lsp
from pygls.exceptions import JsonRpcInvalidParams
from pygls.uris import from_fs_path, to_fs_path
from pygls.workspace import TextDocument

from aner_lsp import __version__
from aner_lsp.positions import LineIndex
from aner_lsp.stale import AnalysisView, ShiftedAnalysis
from aner_lsp.transport import BoundedServer

if TYPE_CHECKING:
    from aner_lang.check import Analysis
    from aner_lsp.file_checks import Checked


ANALYSIS_LIMIT = 1 << 20
"""The longest buffer analysed live, in characters: analysis takes a few seconds per MiB, and the
server must keep answering. `aner check` checks longer files (up to `files.SCRIPT_LIMIT`)."""


def _too_large(path: str | None, source: str) -> Analysis:
    from aner_lang.check import Analysis
    from aner_lang.grammar import ast
    from aner_lang.grammar.ast import Span
    from aner_lang.problems.diagnostics import Diagnostic

    d = Diagnostic(
        "E-FILE-TOO-LARGE",
        Span(1, 1, 1, 1, 0, 0),
        f"this file has {len(source):,} characters; the language server analyses at most "
        f"{ANALYSIS_LIMIT:,}",
        notes=("run `aner check` on it instead",),
        path=path,
    )
    return Analysis(path, source, ast.Module(path, ()), diagnostics=[d])


@dataclass
class Snapshot:
    """The analysis of one buffer version, with the line index of the same text."""

    analysis: Analysis
    index: LineIndex
    version: int | None


class AnerServer(BoundedServer):
    def __init__(self) -> None:
        super().__init__("aner-lsp", __version__)
        self.snapshots: dict[str, Snapshot] = {}
        self.pending: dict[str, asyncio.Task[None]] = {}
        """The debounced background analysis and file checks of each buffer with edits not yet
        analysed or checked."""
        self.checked: dict[str, Checked] = {}
        """The last file checks of each buffer (`file_checks`)."""
        self.file_checks = ThreadPoolExecutor(1, thread_name_prefix="aner-file-checks")
        """The one thread the file checks run on, one after the other."""

    def document(self, uri: str) -> TextDocument:
        """The open buffer `uri`. Requests are answered about open buffers only: pygls would read
        any other URI from the disk, unbounded (a device, a pipe), on the message loop."""
        doc: TextDocument | None = self.workspace.text_documents.get(uri)
        if doc is None:
            raise JsonRpcInvalidParams(message=f"{uri} is not open in the editor")
        return doc

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
        """Analyse one text of the buffer (pure: safe to run on a worker thread). A buffer
        longer than `ANALYSIS_LIMIT` is not analysed: it gets one diagnostic saying so."""
        from aner_lang.check import analyze

        path = self.path_of(uri)
        if len(source) > ANALYSIS_LIMIT:
            return Snapshot(_too_large(path, source), LineIndex(source), version)
        return Snapshot(analyze(source, path, resolver=self.resolve), LineIndex(source), version)

    def refresh(self, uri: str) -> Snapshot:
        doc = self.document(uri)
        snap = self.analyse(uri, doc.source, doc.version)
        self.snapshots[uri] = snap
        return snap

    def live(self, uri: str) -> tuple[AnalysisView, LineIndex]:
        """For completion and signature help: the analysis to answer from and the live text's
        index. While an edit is still being analysed, the previous analysis seen through it."""
        doc = self.document(uri)
        snap = self.snapshots.get(uri)
        if snap is None:
            snap = self.refresh(uri)
        if snap.version == doc.version and snap.analysis.source == doc.source:
            return snap.analysis, snap.index
        return ShiftedAnalysis(snap.analysis, doc.source), LineIndex(doc.source)

    def snapshot(self, uri: str) -> Snapshot:
        """The analysis of the buffer's current text (analysed now if the last one is older)."""
        doc = self.document(uri)
        snap = self.snapshots.get(uri)
        return (
            snap
            if snap is not None
            and snap.version == doc.version
            and snap.analysis.source == doc.source
            else self.refresh(uri)
        )

    def snapshot_at(self, uri: str, position: lsp.Position) -> tuple[Snapshot, int]:
        """The current snapshot and the offset of `position` in it."""
        snap = self.snapshot(uri)
        return snap, snap.index.offset(position)

    def index_of(self, path: str) -> LineIndex:
        """The line index of a file: its open buffer if there is one, else the disk."""
        uri = from_fs_path(path)
        if uri in self.snapshots:
            return self.snapshots[uri].index
        doc = self.workspace.text_documents.get(uri)
        if doc is not None:
            return LineIndex(doc.source)
        from aner_lang.host import files

        return LineIndex(files.read_text(path, files.SCRIPT_LIMIT))

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
from dataclasses import dataclass
from typing import TYPE_CHECKING

from lsprotocol import types as lsp
from pygls.lsp.server import LanguageServer
from pygls.uris import from_fs_path, to_fs_path

from aner_lsp import __version__
from aner_lsp.positions import LineIndex
from aner_lsp.stale import AnalysisView, ShiftedAnalysis

if TYPE_CHECKING:
    from aner_lang.check import Analysis


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
        self.pending: dict[str, asyncio.Task[None]] = {}
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

    def live(self, uri: str) -> tuple[AnalysisView, LineIndex]:
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
        """The analysis of the buffer's current text (analysed now if the last one is older)."""
        doc = self.workspace.get_text_document(uri)
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
        with open(path, encoding="utf-8") as f:
            return LineIndex(f.read())

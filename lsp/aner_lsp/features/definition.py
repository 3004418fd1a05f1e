"""Go to definition: where the name under the cursor is defined, also in an imported file (whose
open buffer, if any, is used before the disk)."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from lsprotocol import types as lsp
from pygls.uris import from_fs_path

from aner_lsp.documents import AnerServer

if TYPE_CHECKING:
    from aner_lang.check.analysis import Analysis
    from aner_lsp.positions import LineIndex


def definition(
    analysis: Analysis,
    offset: int,
    uri: str,
    index: LineIndex,
    uri_of: Callable[[str], str],
    index_of: Callable[[str], LineIndex],
) -> lsp.Location | None:
    """Where the name at `offset` is defined: in this buffer (`uri`, `index`) or in an imported
    file, whose path `uri_of` and `index_of` map to its URI and `LineIndex`."""
    d = analysis.definition_at(offset)
    if d is None or d.span is None:
        return None
    if d.path is None or d.path == analysis.path:
        return lsp.Location(uri=uri, range=index.span_range(d.span))
    return lsp.Location(uri=uri_of(d.path), range=index_of(d.path).span_range(d.span))


def on_definition(ls: AnerServer, params: lsp.DefinitionParams) -> lsp.Location | None:
    snap, offset = ls.snapshot_at(params.text_document.uri, params.position)
    uri = params.text_document.uri
    return definition(snap.analysis, offset, uri, snap.index, from_fs_path, ls.index_of)


def register(server: AnerServer) -> None:
    server.feature(lsp.TEXT_DOCUMENT_DEFINITION)(on_definition)

"""Find references and rename, over the uses of names that the checker resolved.

References lists the uses in this buffer of whatever the name under the cursor is defined as (a
binding, `fn`, record or enum, declared here or imported). Rename is limited to the bindings of
this file (`let`, parameter, `for` variable): renaming a declaration that other files may import
would need edits in them too, and the server analyses one buffer at a time. The new name must be
a name the language accepts (not a keyword, not `1 bad`): anything else is refused with an
InvalidParams error, never written into the buffer."""

from __future__ import annotations

import re
from typing import TYPE_CHECKING

from lsprotocol import types as lsp
from pygls.exceptions import JsonRpcInvalidParams

from aner_lsp.documents import AnerServer
from aner_lsp.lexer import KEYWORDS

if TYPE_CHECKING:
    from aner_lang.check.analysis import Analysis, Definition
    from aner_lang.grammar.ast import Span
    from aner_lsp.positions import LineIndex

RENAMEABLE = ("let", "param", "for")
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def _spans(analysis: Analysis, d: Definition, declaration: bool) -> list[Span]:
    """The uses of `d` in this file, after its own name when `declaration` is asked for and `d`
    is declared in this file."""
    own = [d.span] if declaration and d.span is not None and d.path == analysis.path else []
    return own + [r.span for r in analysis.references_to(d)]


def references(
    analysis: Analysis, offset: int, include_declaration: bool, uri: str, index: LineIndex
) -> list[lsp.Location] | None:
    """Where the name at `offset` is used in this file; None when it names no user definition."""
    d = analysis.definition_at(offset)
    if d is None:
        return None
    return [
        lsp.Location(uri, index.span_range(s)) for s in _spans(analysis, d, include_declaration)
    ]


def rename(
    analysis: Analysis, offset: int, new_name: str, uri: str, index: LineIndex
) -> lsp.WorkspaceEdit | None:
    """Rename a binding of this file (a `let`, parameter or `for` variable) and all its uses."""
    if _NAME.fullmatch(new_name) is None or new_name in KEYWORDS:
        raise JsonRpcInvalidParams(message=f"{new_name!r} is not a name Aner accepts")
    d = analysis.definition_at(offset)
    if d is None or d.span is None or d.kind not in RENAMEABLE or d.path != analysis.path:
        return None
    return lsp.WorkspaceEdit(
        changes={
            uri: [
                lsp.TextEdit(index.span_range(s), new_name)
                for s in _spans(analysis, d, declaration=True)
            ]
        }
    )


def on_references(ls: AnerServer, params: lsp.ReferenceParams) -> list[lsp.Location] | None:
    snap, offset = ls.snapshot_at(params.text_document.uri, params.position)
    return references(
        snap.analysis,
        offset,
        params.context.include_declaration,
        params.text_document.uri,
        snap.index,
    )


def on_rename(ls: AnerServer, params: lsp.RenameParams) -> lsp.WorkspaceEdit | None:
    snap, offset = ls.snapshot_at(params.text_document.uri, params.position)
    return rename(snap.analysis, offset, params.new_name, params.text_document.uri, snap.index)


def register(server: AnerServer) -> None:
    server.feature(lsp.TEXT_DOCUMENT_REFERENCES)(on_references)
    server.feature(lsp.TEXT_DOCUMENT_RENAME)(on_rename)

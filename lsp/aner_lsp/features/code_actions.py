"""Code actions: a quick fix for every diagnostic that carries a did-you-mean suggestion (an
unknown name, type, field, enum member or named argument), replacing the text under the
diagnostic's span with the suggestion.

Fixes are computed from the analysis of the buffer's current text, not from the diagnostics the
client sends back, so an edit always addresses the text it will be applied to."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from lsprotocol import types as lsp

from aner_lsp.documents import AnerServer
from aner_lsp.features.diagnostics import own_diagnostics, to_lsp

if TYPE_CHECKING:
    from aner_lang.check.analysis import Analysis
    from aner_lsp.positions import LineIndex

KINDS = [lsp.CodeActionKind.QuickFix]


def _touches(a: lsp.Range, b: lsp.Range) -> bool:
    """Whether the ranges overlap or meet (a cursor at either end of a word touches it)."""

    def key(p: lsp.Position) -> tuple[int, int]:
        return p.line, p.character

    return key(a.start) <= key(b.end) and key(b.start) <= key(a.end)


def quick_fixes(
    analysis: Analysis, index: LineIndex, uri: str, where: lsp.Range
) -> list[lsp.CodeAction]:
    """One preferred quick fix per suggestion-carrying diagnostic that touches `where`."""
    out = []
    for d, span in own_diagnostics(analysis):
        diagnostic = to_lsp(d, span, index)
        if d.suggestion is None or not _touches(diagnostic.range, where):
            continue
        old = analysis.source[span.start : span.end]
        out.append(
            lsp.CodeAction(
                title=f"Change `{old}` to `{d.suggestion}`",
                kind=lsp.CodeActionKind.QuickFix,
                diagnostics=[diagnostic],
                is_preferred=True,
                edit=lsp.WorkspaceEdit(
                    changes={uri: [lsp.TextEdit(diagnostic.range, d.suggestion)]}
                ),
            )
        )
    return out


def _wanted(only: Sequence[str] | None) -> bool:
    """Whether the client's `only` filter admits quick fixes (kinds are dotted hierarchies:
    asking for `quickfix` also asks for `quickfix.x`, never the other way round)."""
    kind = lsp.CodeActionKind.QuickFix.value
    return only is None or any(kind == k or kind.startswith(k + ".") for k in only)


def on_code_action(ls: AnerServer, params: lsp.CodeActionParams) -> list[lsp.CodeAction] | None:
    if not _wanted(params.context.only):
        return None
    snap = ls.snapshot(params.text_document.uri)
    return quick_fixes(snap.analysis, snap.index, params.text_document.uri, params.range) or None


def register(server: AnerServer) -> None:
    server.feature(lsp.TEXT_DOCUMENT_CODE_ACTION, lsp.CodeActionOptions(code_action_kinds=KINDS))(
        on_code_action
    )

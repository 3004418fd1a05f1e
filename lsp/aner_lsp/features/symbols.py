"""Document symbols: the file's top-level `let`s, `fn`s with their parameters, records with their
fields and enums with their members."""

from __future__ import annotations

from typing import TYPE_CHECKING

from lsprotocol import types as lsp

from aner_lsp.documents import AnerServer

if TYPE_CHECKING:
    from aner_lang.check.analysis import Analysis
    from aner_lang.grammar.ast import Span
    from aner_lsp.positions import LineIndex


def document_symbols(analysis: Analysis, index: LineIndex) -> list[lsp.DocumentSymbol]:
    from aner_lang.grammar import ast  # the parser: not at server start

    def symbol(
        name: str,
        kind: lsp.SymbolKind,
        span: Span,
        name_span: Span,
        children: list[lsp.DocumentSymbol] | None = None,
    ) -> lsp.DocumentSymbol:
        return lsp.DocumentSymbol(
            name=name,
            kind=kind,
            range=index.span_range(span),
            selection_range=index.span_range(name_span),
            children=children or None,
        )

    out = []
    for s in analysis.module.body:
        if isinstance(s, ast.Let):
            out.append(symbol(s.name, lsp.SymbolKind.Variable, s.span, s.name_span))
        elif isinstance(s, ast.FnDecl):
            params = [
                symbol(p.name, lsp.SymbolKind.Variable, p.span, p.name_span) for p in s.params
            ]
            out.append(symbol(s.name, lsp.SymbolKind.Function, s.span, s.name_span, params))
        elif isinstance(s, ast.RecordDecl):
            fields = [symbol(f.name, lsp.SymbolKind.Field, f.span, f.name_span) for f in s.fields]
            out.append(symbol(s.name, lsp.SymbolKind.Struct, s.span, s.name_span, fields))
        elif isinstance(s, ast.EnumDecl):
            members = [symbol(m.name, lsp.SymbolKind.EnumMember, m.span, m.span) for m in s.members]
            out.append(symbol(s.name, lsp.SymbolKind.Enum, s.span, s.name_span, members))
    return out


def on_document_symbols(
    ls: AnerServer, params: lsp.DocumentSymbolParams
) -> list[lsp.DocumentSymbol]:
    snap = ls.snapshot(params.text_document.uri)
    return document_symbols(snap.analysis, snap.index)


def register(server: AnerServer) -> None:
    server.feature(lsp.TEXT_DOCUMENT_DOCUMENT_SYMBOL)(on_document_symbols)

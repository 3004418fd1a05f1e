"""Semantic tokens: the tolerant lexer's classes (keyword, string, number, comment), names refined
by what the checker resolved them to; builtins carry the `defaultLibrary` modifier, a name's own
declaration the `declaration` modifier."""

from __future__ import annotations

from typing import TYPE_CHECKING

from lsprotocol import types as lsp

from aner_lang.builtins import Registry, registry
from aner_lsp.documents import AnerServer
from aner_lsp.legend import TOKEN_MODIFIERS, TOKEN_TYPES
from aner_lsp.lexer import Tok, tokens

if TYPE_CHECKING:
    from aner_lang.check.analysis import Analysis
    from aner_lsp.positions import LineIndex

_DEF_TOKEN = {
    "let": "variable",
    "for": "variable",
    "param": "parameter",
    "fn": "function",
    "record": "type",
    "enum": "enum",
}
_DECLARATION = 1 << TOKEN_MODIFIERS.index("declaration")
_DEFAULT_LIBRARY = 1 << TOKEN_MODIFIERS.index("defaultLibrary")
_BUILTIN_TYPES = ("Int", "Float", "Bool", "String", "Bytes", "List", "Any")

Classified = tuple[str | None, int]
"""A token type of the legend (None: not sent) and the modifier bits."""


def semantic_tokens(analysis: Analysis, index: LineIndex) -> lsp.SemanticTokens:
    """Every classified token of the text, relative-encoded as the protocol wants (UTF-16)."""
    resolved: dict[int, Classified] = {}
    for d in analysis.definitions:
        if d.span is not None and d.path == analysis.path:
            resolved[d.span.start] = (_DEF_TOKEN.get(d.kind, "variable"), _DECLARATION)
    for r in analysis.references:
        resolved.setdefault(r.span.start, (_DEF_TOKEN.get(r.definition.kind, "variable"), 0))
    reg = registry()
    data: list[int] = []
    prev_line = prev_col = 0
    toks = tokens(analysis.source)
    for i, t in enumerate(toks):
        kind, mods = _classify(t, toks, i, resolved, reg)
        if kind is None or "\n" in t.text:
            continue
        pos = index.position(t.start)
        length = index.position(t.end).character - pos.character
        data += [
            pos.line - prev_line,
            pos.character - (prev_col if pos.line == prev_line else 0),
            length,
            TOKEN_TYPES.index(kind),
            mods,
        ]
        prev_line, prev_col = pos.line, pos.character
    return lsp.SemanticTokens(data=data)


def _classify(
    t: Tok, toks: list[Tok], i: int, resolved: dict[int, Classified], reg: Registry
) -> Classified:
    if t.kind in ("keyword", "string", "number", "comment"):
        return t.kind, 0
    if t.kind != "name":
        return None, 0
    if t.start in resolved:
        return resolved[t.start]
    after_dot = i > 0 and toks[i - 1].text == "."
    called = i + 1 < len(toks) and toks[i + 1].text == "("
    if after_dot:
        return ("function" if called else "property"), 0
    if t.text in reg.functions:
        return "function", _DEFAULT_LIBRARY
    if t.text in reg.types or t.text in reg.enums or t.text in _BUILTIN_TYPES:
        return "type", _DEFAULT_LIBRARY
    if any(t.text == m.name for e in reg.enums.values() for m in e.members):
        return "enumMember", _DEFAULT_LIBRARY
    return None, 0


def on_semantic_tokens(ls: AnerServer, params: lsp.SemanticTokensParams) -> lsp.SemanticTokens:
    snap = ls.snapshot(params.text_document.uri)
    return semantic_tokens(snap.analysis, snap.index)


def register(server: AnerServer) -> None:
    server.feature(
        lsp.TEXT_DOCUMENT_SEMANTIC_TOKENS_FULL,
        lsp.SemanticTokensLegend(token_types=TOKEN_TYPES, token_modifiers=TOKEN_MODIFIERS),
    )(on_semantic_tokens)

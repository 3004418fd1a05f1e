"""Document formatting: re-indent by bracket depth (two spaces a level), strip trailing spaces,
keep at most one blank line in a row and end with one newline.

The language has no formatter of its own, so this one is deliberately conservative: it only
touches whitespace at line starts and ends, and it is only applied when the file parses cleanly
before and after and both parses give the same syntax tree (spans aside). Anything else leaves
the buffer alone."""

from __future__ import annotations

from dataclasses import fields, is_dataclass

from lsprotocol import types

from aner_lsp.documents import AnerServer
from aner_lsp.lexer import tokens
from aner_lsp.positions import LineIndex

INDENT = "  "
_OPENERS = frozenset("([{")
_CLOSERS = frozenset(")]}")


def _line_depths(source: str) -> list[int | None]:
    """The indentation level of each line: the `{` blocks open at its start, one less if it
    starts by closing one, one more if it continues a method chain with a leading `.`. None for a
    line that starts inside `(` or `[`: its hand alignment is kept."""
    depths: list[int | None] = [0]
    stack: list[str] = []
    first_on_line = True
    for tok in tokens(source):
        if tok.kind == "newline":
            depths.append(None if "(" in stack or "[" in stack else stack.count("{"))
            first_on_line = True
            continue
        depth = depths[-1]
        if first_on_line and depth is not None and tok.text in ("}", "."):
            depths[-1] = depth + (-1 if tok.text == "}" else 1)
        first_on_line = False
        if tok.text in _OPENERS:
            stack.append(tok.text)
        elif tok.text in _CLOSERS and stack:
            stack.pop()
    return depths


def reindent(source: str) -> str:
    """`source` with normalised line-start/line-end whitespace (no check that it is safe)."""
    newline = "\r\n" if "\r\n" in source else "\n"
    out: list[str] = []
    source = source.replace("\r\n", "\n")
    for line, depth in zip(source.split("\n"), _line_depths(source)):
        text = line.rstrip() if depth is None else line.strip()
        if text or (out and out[-1]):
            out.append(INDENT * max(0, depth) + text if text and depth is not None else text)
    while out and not out[-1]:
        out.pop()
    return newline.join(out) + newline if out else ""


def _shape(node: object) -> object:
    """A syntax tree as nested tuples without spans (wherever they sit), so two parses compare."""
    from aner_lang.grammar.ast import Span

    if isinstance(node, Span):
        return None
    if is_dataclass(node):
        return (type(node).__name__,) + tuple(_shape(getattr(node, f.name)) for f in fields(node))
    if isinstance(node, (tuple, list)):
        return tuple(_shape(item) for item in node)
    return node


def format_source(source: str) -> str | None:
    """The formatted text, or None when formatting is not provably safe (syntax errors, or the
    result would parse differently)."""
    from aner_lang.grammar import parse  # the parser is built on first use, not at server start

    before, errors = parse(source)
    if errors:
        return None
    formatted = reindent(source)
    if formatted == source:
        return formatted
    after, errors = parse(formatted)
    return formatted if not errors and _shape(after) == _shape(before) else None


def formatting_edits(source: str, index: LineIndex) -> list[types.TextEdit]:
    """One whole-document edit, or none when the text is already formatted or cannot be safely."""
    formatted = format_source(source)
    if formatted is None or formatted == source:
        return []
    return [types.TextEdit(index.range(0, len(source)), formatted)]


def on_formatting(ls: AnerServer, params: types.DocumentFormattingParams) -> list[types.TextEdit]:
    doc = ls.document(params.text_document.uri)
    return formatting_edits(doc.source, LineIndex(doc.source))


def register(server: AnerServer) -> None:
    server.feature(types.TEXT_DOCUMENT_FORMATTING)(on_formatting)

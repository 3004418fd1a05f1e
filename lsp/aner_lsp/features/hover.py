"""Hover: the inferred type of a user binding; the signatures and registry docs of a builtin;
enum members, builtin types and fields with their docs; else the type of the expression."""

from __future__ import annotations

from typing import TYPE_CHECKING

from lsprotocol import types as lsp

from aner_lang.builtins import registry
from aner_lang.builtins.reference import signature
from aner_lsp.documents import AnerServer
from aner_lsp.markup import aner_code, markdown
from aner_lsp.types_at import base_name, fields_of

if TYPE_CHECKING:
    from aner_lang.check.analysis import Analysis
    from aner_lsp.positions import LineIndex


def _word_at(source: str, offset: int) -> tuple[str, int, int] | None:
    """The identifier around `offset` and its [start, end)."""
    start = offset
    while start > 0 and (source[start - 1].isalnum() or source[start - 1] == "_"):
        start -= 1
    end = offset
    while end < len(source) and (source[end].isalnum() or source[end] == "_"):
        end += 1
    return (source[start:end], start, end) if end > start else None


def hover(analysis: Analysis, offset: int, index: LineIndex) -> lsp.Hover | None:
    source = analysis.source
    word = _word_at(source, offset)
    if word is None:
        return None
    name, start, end = word
    reg = registry()
    d = analysis.definition_at(offset)
    if d is not None:
        text = aner_code(f"{d.name}: {d.type}" if d.kind != "fn" else d.type)
    elif name in reg.functions:
        text = "\n\n".join(aner_code(signature(b), b.doc) for b in reg.functions[name])
    elif name in reg.types or name in reg.enums:
        decl = reg.types.get(name) or reg.enums[name]
        text = aner_code(name, decl.doc)
    elif (
        start > 1
        and source[start - 1] == "."
        and (field := _field_doc(analysis, start - 2, name)) is not None
    ):
        text = field
    else:
        member = next(
            ((e, m) for e in reg.enums.values() for m in e.members if m.name == name), None
        )
        ty = analysis.type_at(offset)
        if member is not None:
            text = aner_code(f"{member[0].name}.{member[1].name}", member[1].doc)
        elif ty is not None:
            text = aner_code(ty)
        else:
            return None
    return lsp.Hover(contents=markdown(text), range=index.range(start, end))


def _field_doc(analysis: Analysis, object_end: int, name: str) -> str | None:
    """`Owner.field: Type` and the registry's doc of a field read with `x.field`."""
    owner = analysis.type_at(object_end)
    if owner is None or (ty := fields_of(analysis, owner).get(name)) is None:
        return None
    decl = registry().types.get(base_name(owner))
    doc = next((f.doc for f in decl.fields if f.name == name), "") if decl is not None else ""
    return aner_code(f"{base_name(owner)}.{name}: {ty}", doc)


def on_hover(ls: AnerServer, params: lsp.HoverParams) -> lsp.Hover | None:
    snap, offset = ls.snapshot_at(params.text_document.uri, params.position)
    return hover(snap.analysis, offset, snap.index)


def register(server: AnerServer) -> None:
    server.feature(lsp.TEXT_DOCUMENT_HOVER)(on_hover)

"""Completion: keywords, names in scope and builtins; after `x.` the fields of `x`'s type and the
functions that take it first (method syntax); inside a call the named arguments not given yet,
and enum members where the parameter expects an enum; files and folders inside `import "...`.

Completion never waits for an analysis: the cursor's context comes from the live text
(`cursor.context_at`), names and types from the last analysis seen through the edit."""

from __future__ import annotations

import os
from functools import lru_cache
from typing import TYPE_CHECKING

from lsprotocol import types as lsp

from aner_lang.builtins import registry
from aner_lang.builtins.reference import signature
from aner_lsp.cursor import CallFrame, context_at
from aner_lsp.documents import AnerServer
from aner_lsp.lexer import KEYWORDS
from aner_lsp.markup import markdown
from aner_lsp.signatures import SignatureView, active_parameter, signatures_of
from aner_lsp.types_at import accepts_receiver, base_name, chain_type, fields_of

if TYPE_CHECKING:
    from aner_lang.check.analysis import Definition
    from aner_lsp.stale import AnalysisView

TRIGGER_CHARACTERS = [".", "(", ",", ":", '"', "/"]

_KINDS = {
    "let": lsp.CompletionItemKind.Variable,
    "param": lsp.CompletionItemKind.Variable,
    "for": lsp.CompletionItemKind.Variable,
    "fn": lsp.CompletionItemKind.Function,
    "record": lsp.CompletionItemKind.Struct,
    "enum": lsp.CompletionItemKind.Enum,
}


def completion(
    analysis: AnalysisView, source: str, offset: int, directory: str | None
) -> list[lsp.CompletionItem]:
    """The items at `offset` of the live `source`; `directory` is the buffer's folder (for
    import paths), None for an unsaved buffer (the working directory is used)."""
    ctx = context_at(source, offset)
    if ctx.import_path is not None:
        return _import_paths(ctx.import_path, directory)
    if ctx.in_string_or_comment or ctx.after_let:
        return []
    if ctx.member_of is not None:
        return _members(analysis, chain_type(analysis, ctx.member_of, offset), offset)
    scope = analysis.scope_at(offset)
    items: list[lsp.CompletionItem] = []
    if ctx.call is not None:
        items += _call_items(analysis, ctx.call, offset, scope, ctx.in_list)
    for name, d in sorted(scope.items()):
        items.append(lsp.CompletionItem(name, kind=_KINDS.get(d.kind), detail=d.type))
    items += [i for i in _global_items() if i.label not in scope]
    return items


@lru_cache(maxsize=1)
def _global_items() -> tuple[lsp.CompletionItem, ...]:
    """Keywords, builtin functions and builtin types: the same for every buffer, built once."""
    reg = registry()
    items = [lsp.CompletionItem(k, kind=lsp.CompletionItemKind.Keyword) for k in sorted(KEYWORDS)]
    for name, overloads in sorted(reg.functions.items()):
        items.append(
            lsp.CompletionItem(
                name,
                kind=lsp.CompletionItemKind.Function,
                detail=signature(overloads[0]),
                documentation=markdown(overloads[0].doc),
            )
        )
    for name in sorted(set(reg.types) | set(reg.enums)):
        items.append(lsp.CompletionItem(name, kind=lsp.CompletionItemKind.Class))
    return tuple(items)


def _import_paths(typed: str, directory: str | None) -> list[lsp.CompletionItem]:
    """`.aner` files and folders under the importing file's folder, relative to what is typed
    (an absolute path lists nothing: imports are relative, and the file system is not browsed)."""
    if os.path.isabs(typed):
        return []
    folder = os.path.join(directory or os.getcwd(), os.path.dirname(typed))
    try:
        entries = sorted(os.scandir(folder), key=lambda e: e.name)
    except OSError:
        return []
    out = []
    for e in entries:
        if e.is_dir() and not e.name.startswith("."):
            out.append(lsp.CompletionItem(e.name + "/", kind=lsp.CompletionItemKind.Folder))
        elif e.name.endswith(".aner"):
            out.append(lsp.CompletionItem(e.name, kind=lsp.CompletionItemKind.File))
    return out


def _members(analysis: AnalysisView, ty: str | None, offset: int) -> list[lsp.CompletionItem]:
    """Fields of the receiver's type, then every function that takes it first (method syntax)."""
    if ty is None:
        return []
    items = [
        lsp.CompletionItem(n, kind=lsp.CompletionItemKind.Field, detail=t)
        for n, t in fields_of(analysis, ty).items()
    ]
    seen = set()
    for name, overloads in registry().functions.items():
        for b in overloads:
            if b.params and accepts_receiver(b.params[0].type, ty) and name not in seen:
                seen.add(name)
                items.append(
                    lsp.CompletionItem(
                        name,
                        kind=lsp.CompletionItemKind.Method,
                        detail=signature(b),
                        documentation=markdown(b.doc),
                    )
                )
    scope = analysis.scope_at(offset)
    for name, d in scope.items():
        if d.kind == "fn":
            sig = signatures_of(analysis, name, offset, scope)[0]
            if sig.params and accepts_receiver(sig.params[0].type, ty):
                items.append(
                    lsp.CompletionItem(name, kind=lsp.CompletionItemKind.Method, detail=sig.label())
                )
    return items


def _filled(frame: CallFrame, sig: SignatureView) -> set[str]:
    """Parameters of `sig` the call has given already (positionally, by receiver or by name)."""
    first = frame.positional + (1 if frame.receiver else 0)
    return {p.name for p in sig.params[:first]} | set(frame.named)


def _enum_members(type_name: str, scope: dict[str, Definition]) -> list[str]:
    """The members of the builtin or user enum `type_name` (none if it is not an enum)."""
    from aner_lang.grammar import ast  # the parser: not at server start

    decl = registry().enums.get(base_name(type_name))
    if decl is not None:
        return [m.name for m in decl.members]
    d = scope.get(base_name(type_name))
    return (
        [m.name for m in d.node.members]
        if d is not None and isinstance(d.node, ast.EnumDecl)
        else []
    )


def _call_items(
    analysis: AnalysisView,
    frame: CallFrame,
    offset: int,
    scope: dict[str, Definition],
    in_list: bool,
) -> list[lsp.CompletionItem]:
    """Enum members where the parameter being filled expects an enum (or a list of one); else,
    outside a list, the named arguments not given yet."""
    items: list[lsp.CompletionItem] = []
    seen: set[str] = set()
    for sig in signatures_of(analysis, frame.callee, offset, scope):
        param = active_parameter(frame, sig)
        if param is not None:
            p = sig.params[param]
            elem = p.type[5:-1] if p.type.startswith("List[") else p.type
            for m in _enum_members(elem, scope):
                if m not in seen:
                    seen.add(m)
                    items.append(
                        lsp.CompletionItem(
                            m,
                            kind=lsp.CompletionItemKind.EnumMember,
                            detail=base_name(elem),
                            sort_text="0" + m,
                        )
                    )
        if frame.current is None and not in_list:
            for p in sig.params:
                if p.name not in _filled(frame, sig) and p.name + ":" not in seen:
                    seen.add(p.name + ":")
                    items.append(
                        lsp.CompletionItem(
                            p.name + ":",
                            kind=lsp.CompletionItemKind.Property,
                            detail=p.type,
                            insert_text=p.name + ": ",
                            sort_text="1" + p.name,
                            documentation=markdown(p.doc) if p.doc else None,
                        )
                    )
    return items


def on_completion(ls: AnerServer, params: lsp.CompletionParams) -> lsp.CompletionList:
    analysis, index = ls.live(params.text_document.uri)
    path = ls.path_of(params.text_document.uri)
    items = completion(
        analysis,
        index.source,
        index.offset(params.position),
        os.path.dirname(path) if path else None,
    )
    return lsp.CompletionList(is_incomplete=False, items=items)


def register(server: AnerServer) -> None:
    server.feature(
        lsp.TEXT_DOCUMENT_COMPLETION, lsp.CompletionOptions(trigger_characters=TRIGGER_CHARACTERS)
    )(on_completion)

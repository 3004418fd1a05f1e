"""The language features as pure functions: (Analysis of the buffer, live text, offset) ->
lsprotocol result. The server module only wires them to requests."""

from __future__ import annotations

import os
from functools import lru_cache

from lsprotocol import types as lsp

from aner_lang.builtins import registry
from aner_lang.check.analysis import Analysis
from aner_lang.grammar import ast
from aner_lsp.cursor import CallFrame, context_at
from aner_lsp.legend import TOKEN_TYPES
from aner_lsp.lexer import KEYWORDS, tokens
from aner_lsp.positions import LineIndex
from aner_lsp.signatures import SignatureView, builtin_signatures, signatures_of
from aner_lsp.types_at import accepts_receiver, base_name, chain_type, fields_of

_KINDS = {
    "let": lsp.CompletionItemKind.Variable,
    "param": lsp.CompletionItemKind.Variable,
    "for": lsp.CompletionItemKind.Variable,
    "fn": lsp.CompletionItemKind.Function,
    "record": lsp.CompletionItemKind.Struct,
    "enum": lsp.CompletionItemKind.Enum,
}
_SEVERITY = {"error": lsp.DiagnosticSeverity.Error, "warning": lsp.DiagnosticSeverity.Warning}
_DEF_TOKEN = {
    "let": "variable",
    "for": "variable",
    "param": "parameter",
    "fn": "function",
    "record": "type",
    "enum": "enum",
}


def _md(text: str) -> lsp.MarkupContent:
    return lsp.MarkupContent(kind=lsp.MarkupKind.Markdown, value=text)


# ---- diagnostics --------------------------------------------------------------------------------


def diagnostics(analysis: Analysis, index: LineIndex) -> list[lsp.Diagnostic]:
    """The checker's diagnostics that belong to this file (imported files report their own)."""
    out = []
    for d in analysis.diagnostics:
        if d.path not in (None, analysis.path) or d.span is None:
            continue
        message = d.message + "".join(f"\n{n}" for n in d.notes)
        if d.suggestion:
            message += f"\nsuggestion: {d.suggestion}"
        out.append(
            lsp.Diagnostic(
                range=index.span_range(d.span),
                message=message,
                code=d.code,
                severity=_SEVERITY.get(d.severity, lsp.DiagnosticSeverity.Information),
                source="aner",
            )
        )
    return out


# ---- completion ---------------------------------------------------------------------------------


def completion(
    analysis: Analysis, source: str, offset: int, directory: str | None
) -> list[lsp.CompletionItem]:
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
                detail=builtin_signatures(name)[0].label(),
                documentation=_md(overloads[0].doc),
            )
        )
    for name in sorted(set(reg.types) | set(reg.enums)):
        items.append(lsp.CompletionItem(name, kind=lsp.CompletionItemKind.Class))
    return tuple(items)


def _import_paths(typed: str, directory: str | None) -> list[lsp.CompletionItem]:
    """`.aner` files and folders under the importing file's folder, relative to what is typed."""
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


def _members(analysis: Analysis, ty: str | None, offset: int) -> list[lsp.CompletionItem]:
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
                        detail=builtin_signatures(name)[0].label(),
                        documentation=_md(b.doc),
                    )
                )
    scope = analysis.scope_at(offset)
    for name, d in scope.items():
        if isinstance(d.node, ast.FnDecl) and d.node.params:
            sig = signatures_of(analysis, name, offset, scope)[0]
            if accepts_receiver(sig.params[0].type, ty):
                items.append(
                    lsp.CompletionItem(name, kind=lsp.CompletionItemKind.Method, detail=sig.label())
                )
    return items


def _filled(frame: CallFrame, sig: SignatureView) -> set[str]:
    """Parameters of `sig` the call has given already (positionally, by receiver or by name)."""
    first = frame.positional + (1 if frame.receiver else 0)
    return {p.name for p in sig.params[:first]} | set(frame.named)


def _enum_members(type_name: str, scope: dict) -> list[str]:
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
    analysis: Analysis, frame: CallFrame, offset: int, scope: dict, in_list: bool
) -> list[lsp.CompletionItem]:
    """Enum members where the parameter being filled expects an enum (or a list of one); else,
    outside a list, the named arguments not given yet."""
    items, seen = [], set()
    for sig in signatures_of(analysis, frame.callee, offset, scope):
        param = _active(frame, sig)
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
                            documentation=_md(p.doc) if p.doc else None,
                        )
                    )
    return items


def _active(frame: CallFrame, sig: SignatureView) -> int | None:
    """Index of the parameter the cursor fills in `sig`, or None when it has no such parameter."""
    names = [p.name for p in sig.params]
    if frame.current is not None:
        return names.index(frame.current) if frame.current in names else None
    index = frame.positional + (1 if frame.receiver else 0)
    return index if index < len(names) else None


# ---- signature help ----------------------------------------------------------------------------


def signature_help(analysis: Analysis, source: str, offset: int) -> lsp.SignatureHelp | None:
    frame = context_at(source, offset).call
    if frame is None:
        return None
    sigs = signatures_of(analysis, frame.callee, offset)
    if not sigs:
        return None
    infos = []
    for sig in sigs:
        params = [
            lsp.ParameterInformation(label=o, documentation=p.doc or None)
            for p, o in zip(sig.params, sig.param_offsets())
        ]
        infos.append(
            lsp.SignatureInformation(
                label=sig.label(),
                parameters=params,
                documentation=_md(sig.doc) if sig.doc else None,
            )
        )
    actives = [_active(frame, s) for s in sigs]
    best = next(
        (
            i
            for i, a in enumerate(actives)
            if a is not None and set(frame.named) <= {p.name for p in sigs[i].params}
        ),
        0,
    )
    return lsp.SignatureHelp(infos, active_signature=best, active_parameter=actives[best])


# ---- hover, definition, rename, symbols ----------------------------------------------------------


def _word_at(source: str, offset: int) -> tuple[str, int, int] | None:
    start = offset
    while start > 0 and (source[start - 1].isalnum() or source[start - 1] == "_"):
        start -= 1
    end = offset
    while end < len(source) and (source[end].isalnum() or source[end] == "_"):
        end += 1
    return (source[start:end], start, end) if end > start else None


def hover(analysis: Analysis, source: str, offset: int, index: LineIndex) -> lsp.Hover | None:
    word = _word_at(source, offset)
    if word is None:
        return None
    name, start, end = word
    reg = registry()
    d = analysis.definition_at(offset)
    if d is not None:
        text = f"```aner\n{d.name}: {d.type}\n```" if d.kind != "fn" else f"```aner\n{d.type}\n```"
    elif name in reg.functions:
        text = "\n\n".join(
            f"```aner\n{s.label()}\n```\n{s.doc}" for s in signatures_of(analysis, name, offset)
        )
    elif name in reg.types or name in reg.enums:
        decl = reg.types.get(name) or reg.enums[name]
        text = f"```aner\n{name}\n```\n{decl.doc}"
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
            text = f"```aner\n{member[0].name}.{member[1].name}\n```\n{member[1].doc}"
        elif ty is not None:
            text = f"```aner\n{ty}\n```"
        else:
            return None
    return lsp.Hover(contents=_md(text), range=index.range(start, end))


def _field_doc(analysis: Analysis, object_end: int, name: str) -> str | None:
    """`Owner.field: Type` and the registry's doc of a field read with `x.field`."""
    owner = analysis.type_at(object_end)
    ty = None if owner is None else fields_of(analysis, owner).get(name)
    if ty is None:
        return None
    decl = registry().types.get(base_name(owner))
    doc = next((f.doc for f in decl.fields if f.name == name), "") if decl is not None else ""
    return f"```aner\n{base_name(owner)}.{name}: {ty}\n```\n{doc}".rstrip()


def definition(analysis: Analysis, offset: int, uri_of, index_of) -> lsp.Location | None:
    """Where the name at `offset` is defined; `uri_of(path)` and `index_of(path)` map a file path
    (this file or an imported one) to its URI and `LineIndex`."""
    d = analysis.definition_at(offset)
    if d is None or d.span is None:
        return None
    path = d.path if d.path is not None else analysis.path
    return lsp.Location(uri=uri_of(path), range=index_of(path).span_range(d.span))


def rename(
    analysis: Analysis, offset: int, new_name: str, uri: str, index: LineIndex
) -> lsp.WorkspaceEdit | None:
    """Rename a binding of this file (a `let`, parameter or `for` variable) and all its uses."""
    d = analysis.definition_at(offset)
    if (
        d is None
        or d.span is None
        or d.kind not in ("let", "param", "for")
        or d.path != analysis.path
    ):
        return None
    spans = [d.span] + [r.span for r in analysis.references_to(d)]
    return lsp.WorkspaceEdit(
        changes={uri: [lsp.TextEdit(index.span_range(s), new_name) for s in spans]}
    )


def document_symbols(analysis: Analysis, index: LineIndex) -> list[lsp.DocumentSymbol]:
    out = []
    for s in analysis.module.body:
        if isinstance(s, ast.Let):
            out.append(_symbol(s.name, lsp.SymbolKind.Variable, s.span, s.name_span, index))
        elif isinstance(s, ast.FnDecl):
            children = [
                _symbol(p.name, lsp.SymbolKind.Variable, p.span, p.name_span, index)
                for p in s.params
            ]
            out.append(
                _symbol(s.name, lsp.SymbolKind.Function, s.span, s.name_span, index, children)
            )
        elif isinstance(s, ast.RecordDecl):
            children = [
                _symbol(f.name, lsp.SymbolKind.Field, f.span, f.name_span, index) for f in s.fields
            ]
            out.append(_symbol(s.name, lsp.SymbolKind.Struct, s.span, s.name_span, index, children))
        elif isinstance(s, ast.EnumDecl):
            children = [
                _symbol(m.name, lsp.SymbolKind.EnumMember, m.span, m.span, index) for m in s.members
            ]
            out.append(_symbol(s.name, lsp.SymbolKind.Enum, s.span, s.name_span, index, children))
    return out


def _symbol(name, kind, span, name_span, index: LineIndex, children=None) -> lsp.DocumentSymbol:
    return lsp.DocumentSymbol(
        name=name,
        kind=kind,
        range=index.span_range(span),
        selection_range=index.span_range(name_span),
        children=children or None,
    )


# ---- semantic tokens ----------------------------------------------------------------------------


def semantic_tokens(analysis: Analysis, source: str, index: LineIndex) -> lsp.SemanticTokens:
    """Lexical classes from the tolerant lexer, names refined by what the checker resolved them to."""
    resolved: dict[int, tuple[str, int]] = {}
    for d in analysis.definitions:
        if d.span is not None and d.path == analysis.path:
            resolved[d.span.start] = (_DEF_TOKEN.get(d.kind, "variable"), 1)
    for r in analysis.references:
        resolved.setdefault(r.span.start, (_DEF_TOKEN.get(r.definition.kind, "variable"), 0))
    reg = registry()
    data: list[int] = []
    prev_line = prev_col = 0
    toks = tokens(source)
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


def _classify(t, toks, i, resolved, reg) -> tuple[str | None, int]:
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
        return "function", 2
    if (
        t.text in reg.types
        or t.text in reg.enums
        or t.text in ("Int", "Float", "Bool", "String", "Bytes", "List", "Any")
    ):
        return "type", 2
    if any(t.text == m.name for e in reg.enums.values() for m in e.members):
        return "enumMember", 2
    return None, 0

"""Static types of the expressions the cursor code sees as token chains (`run.adapter.`,
`f(1).x`), using the analysis of the buffer's last parse and the registry. Types are handled as
Aner type strings (`List[Int]`, `Run?`), the registry's own notation."""

from __future__ import annotations

from typing import TYPE_CHECKING

from aner_lang.builtins import registry
from aner_lsp.lexer import Tok

if TYPE_CHECKING:
    from aner_lsp.stale import AnalysisView


def base_name(ty: str) -> str:
    """`Run?` -> `Run`; `List[Int]` -> `List`."""
    return ty.rstrip("?").split("[", 1)[0]


def call_returns(analysis: AnalysisView, name: str, offset: int) -> str | None:
    d = analysis.scope_at(offset).get(name)
    if d is not None:
        return str(d.ty) if d.kind in ("fn", "record") else None
    overloads = registry().functions.get(name)
    return overloads[0].returns if overloads else None


def field_type(analysis: AnalysisView, owner: str, name: str) -> str | None:
    return fields_of(analysis, owner).get(name)


def fields_of(analysis: AnalysisView, owner: str) -> dict[str, str]:
    """Field name -> type string of a builtin type or a record this file declares or imports."""
    owner = base_name(owner)
    decl = registry().types.get(owner)
    if decl is not None:
        return {f.name: f.type for f in decl.fields}
    return {n: str(t) for n, t in analysis.field_types.get(owner, {}).items()}


def _skip_group(toks: tuple[Tok, ...], i: int) -> int:
    """Index just past the bracket group opening at `i`."""
    depth = 0
    while i < len(toks):
        if toks[i].text in ("(", "["):
            depth += 1
        elif toks[i].text in (")", "]"):
            depth -= 1
            if depth == 0:
                return i + 1
        i += 1
    return i


def chain_type(analysis: AnalysisView, toks: tuple[Tok, ...], offset: int) -> str | None:
    """The type of the postfix expression `toks`, or None where it cannot be known."""
    if not toks:
        return None
    first = toks[0]
    i = 1
    calls = i < len(toks) and toks[i].text == "("
    if first.kind == "string":
        ty: str | None = "String"
    elif first.kind == "number":
        ty = "Float" if "." in first.text else ("Bytes" if first.text[-1] == "B" else "Int")
    elif calls:
        ty, i = call_returns(analysis, first.text, offset), _skip_group(toks, i)
    else:
        d = analysis.scope_at(offset).get(first.text)
        ty = str(d.ty) if d is not None and d.kind in ("let", "param", "for") else None
    while ty is not None and i < len(toks):
        t = toks[i]
        if t.text == "[":
            ty = ty[5:-1] if ty.startswith("List[") else None
            i = _skip_group(toks, i)
        elif t.text == "." and i + 1 < len(toks):
            name = toks[i + 1].text
            if i + 2 < len(toks) and toks[i + 2].text == "(":
                ty, i = call_returns(analysis, name, offset), _skip_group(toks, i + 2)
            else:
                ty, i = field_type(analysis, ty, name), i + 2
        else:
            return None
    return ty


def accepts_receiver(param_type: str, receiver: str) -> bool:
    """Whether a value of type `receiver` can be a first argument declared `param_type` (method syntax)."""
    p, r = param_type.rstrip("?"), receiver.rstrip("?")
    return p == r or (p == "List[Any]" and r.startswith("List[")) or (p == "Float" and r == "Int")

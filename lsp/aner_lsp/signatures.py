"""One view of every callable the cursor can be in: builtin overloads from the registry, user
`fn`s and record constructors from the analysis. Completion, signature help and hover read it."""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache

from aner_lang.builtins import registry
from aner_lang.builtins.spec import Builtin
from aner_lang.check.analysis import Analysis, _type_text
from aner_lang.grammar import ast


@dataclass(frozen=True)
class ParamView:
    name: str
    type: str
    default: str | None
    doc: str = ""


@dataclass(frozen=True)
class SignatureView:
    name: str
    params: tuple[ParamView, ...]
    returns: str
    doc: str = ""

    def label(self) -> str:
        parts = [
            f"{p.name}: {p.type}" + (f" = {p.default}" if p.default is not None else "")
            for p in self.params
        ]
        return f"{self.name}({', '.join(parts)}) -> {self.returns}"

    def param_offsets(self) -> list[tuple[int, int]]:
        """[start, end) of each parameter inside `label()` (LSP label offsets)."""
        out, pos = [], len(self.name) + 1
        for p in self.params:
            text = f"{p.name}: {p.type}" + (f" = {p.default}" if p.default is not None else "")
            out.append((pos, pos + len(text)))
            pos += len(text) + 2
        return out


def _builtin(b: Builtin) -> SignatureView:
    return SignatureView(
        b.name,
        tuple(ParamView(p.name, p.type, p.default, p.doc) for p in b.params),
        b.returns,
        b.doc,
    )


def _expr_text(e: ast.Expr | None, source: str) -> str | None:
    return None if e is None else source[e.span.start : e.span.end]


def signatures_of(
    analysis: Analysis, name: str, offset: int, scope: dict | None = None
) -> list[SignatureView]:
    """The signatures a call of `name` at `offset` may resolve to (user names shadow builtins).
    `scope` is `analysis.scope_at(offset)` when the caller has it already (it costs a scan)."""
    d = (analysis.scope_at(offset) if scope is None else scope).get(name)
    if d is not None and isinstance(d.node, ast.FnDecl):
        params = tuple(
            ParamView(p.name, _type_text(p.type), _expr_text(p.default, _source(analysis, d)))
            for p in d.node.params
        )
        return [SignatureView(name, params, str(d.ty))]
    if d is not None and isinstance(d.node, ast.RecordDecl):
        params = tuple(
            ParamView(f.name, _type_text(f.type), _expr_text(f.default, _source(analysis, d)))
            for f in d.node.fields
        )
        return [SignatureView(name, params, name)]
    return builtin_signatures(name)


@cache
def builtin_signatures(name: str) -> list[SignatureView]:
    return [_builtin(b) for b in registry().functions.get(name, ())]


def _source(analysis: Analysis, d) -> str:
    """The text of the file that declares `d` (defaults are shown as written)."""
    if d.path == analysis.path:
        return analysis.source
    for imported in analysis.imports.values():
        if imported.path == d.path:
            return imported.source
    return ""

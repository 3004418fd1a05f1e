"""One view of every callable the cursor can be in: builtin overloads from the registry, user
`fn`s and record constructors from the analysis. Completion and signature help read it.

A view's label is written by the registry's `reference.signature_text` (`name(p: T = d) -> R`), so
a builtin reads the same in signature help as in the checker's messages and the reference; where
each parameter sits in the label comes from the same `reference.param_text`."""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache
from typing import TYPE_CHECKING

from aner_lang.builtins import registry
from aner_lang.builtins.reference import param_text, signature_text
from aner_lang.builtins.spec import Param

if TYPE_CHECKING:
    from aner_lang.check.analysis import Definition
    from aner_lang.grammar import ast
    from aner_lsp.cursor import CallFrame
    from aner_lsp.stale import AnalysisView


def _param_text(p: Param) -> str:
    return param_text(p.name, p.type, p.default)


@dataclass(frozen=True)
class SignatureView:
    name: str
    params: tuple[Param, ...]
    returns: str
    doc: str = ""

    def label(self) -> str:
        return signature_text(
            self.name, ((p.name, p.type, p.default) for p in self.params), self.returns
        )

    def param_offsets(self) -> list[tuple[int, int]]:
        """[start, end) of each parameter inside `label()` (LSP label offsets)."""
        out, pos = [], len(self.name) + 1
        for p in self.params:
            text = _param_text(p)
            out.append((pos, pos + len(text)))
            pos += len(text) + 2
        return out


def active_parameter(frame: CallFrame, sig: SignatureView) -> int | None:
    """Index of the parameter the cursor fills in `sig`, or None when it has no such parameter."""
    names = [p.name for p in sig.params]
    if frame.current is not None:
        return names.index(frame.current) if frame.current in names else None
    index = frame.positional + (1 if frame.receiver else 0)
    return index if index < len(names) else None


def signatures_of(
    analysis: AnalysisView, name: str, offset: int, scope: dict[str, Definition] | None = None
) -> list[SignatureView]:
    """The signatures a call of `name` at `offset` may resolve to (user names shadow builtins).
    `scope` is `analysis.scope_at(offset)` when the caller has it already (it costs a scan)."""
    from aner_lang.check.analysis import _type_text  # the parser: not at server start
    from aner_lang.grammar import ast

    d = (analysis.scope_at(offset) if scope is None else scope).get(name)
    if d is not None and isinstance(d.node, ast.FnDecl):
        source = _source(analysis, d)
        params = tuple(
            Param(p.name, _type_text(p.type), _expr_text(p.default, source)) for p in d.node.params
        )
        return [SignatureView(name, params, str(d.ty))]
    if d is not None and isinstance(d.node, ast.RecordDecl):
        source = _source(analysis, d)
        params = tuple(
            Param(f.name, _type_text(f.type), _expr_text(f.default, source)) for f in d.node.fields
        )
        return [SignatureView(name, params, name)]
    return builtin_signatures(name)


@cache
def builtin_signatures(name: str) -> list[SignatureView]:
    return [
        SignatureView(b.name, b.params, b.returns, b.doc)
        for b in registry().functions.get(name, ())
    ]


def _expr_text(e: ast.Expr | None, source: str) -> str | None:
    return None if e is None else source[e.span.start : e.span.end]


def _source(analysis: AnalysisView, d: Definition) -> str:
    """The text of the file that declares `d` (defaults are shown as written)."""
    if d.path == analysis.path:
        return analysis.source
    for imported in analysis.imports.values():
        if imported.path == d.path:
            return imported.source
    return ""

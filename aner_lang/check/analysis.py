"""The analysis snapshot of one file: what the checker found, as a query API for the LSP and the
side tables the interpreter runs from."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, TypeVar

from aner_lang.builtins.reference import signature_text
from aner_lang.grammar import ast
from aner_lang.grammar.ast import Span
from aner_lang.problems.diagnostics import Diagnostic

if TYPE_CHECKING:
    from aner_lang.builtins.spec import Builtin
    from aner_lang.check.core import Param
    from aner_lang.check.types import Type

_V = TypeVar("_V")


@dataclass(eq=False)
class Definition:
    """A name a script defines: `let`, parameter, `for` variable, `fn`, `record`, `enum`."""

    name: str
    kind: str  # let | param | for | fn | record | enum
    ty: Type
    span: Span | None
    path: str | None
    node: object = None
    """The declaring AST node (FnDecl, RecordDecl, EnumDecl, Let, ParamDecl, For)."""
    used: bool = False

    @property
    def type(self) -> str:
        """The inferred type as Aner writes it (`List[Int]`, `fn(rank: Int) -> Run`)."""
        if self.kind == "fn" and isinstance(self.node, ast.FnDecl):
            return fn_signature(self.node, self.ty)
        return str(self.ty)


def fn_signature(fn: ast.FnDecl, returns: Type) -> str:
    """`fn name(param: Type = ..., ...) -> Returns` (a default shows as `...`)."""
    params = ((p.name, _type_text(p.type), None if p.default is None else "...") for p in fn.params)
    return "fn " + signature_text(fn.name, params, str(returns))


def _type_text(t: ast.TypeExpr) -> str:
    """A type as written in source (`List[Int]?`)."""
    if isinstance(t, ast.OptionalType):
        return _type_text(t.inner) + "?"
    return t.name + (f"[{', '.join(_type_text(a) for a in t.args)}]" if t.args else "")


@dataclass(frozen=True)
class Reference:
    span: Span
    definition: Definition


@dataclass(frozen=True)
class ScopeInfo:
    span: Span | None  # None: the whole file
    names: dict[str, Definition]
    parent: ScopeInfo | None


@dataclass
class CallInfo:
    """How a call resolved. `kind`: builtin | fn | record. `bound` maps every parameter (in
    declaration order) to its argument expression or its default expression."""

    call: ast.Call
    name: str
    kind: str
    candidates: tuple[Builtin, ...] | tuple[Definition, ...] = ()
    """The overload set of a builtin, or the one user definition."""
    builtin: Builtin | None = None
    definition: Definition | None = None
    bound: tuple[tuple[str, ast.Expr | None], ...] = ()
    param_types: tuple[Type, ...] = ()
    """The declared type of each parameter in `bound` (the interpreter promotes Int to Float)."""
    receiver: ast.Expr | None = None
    """For method syntax `x.f(a)`: the expression `x` (bound to the first parameter)."""

    def active_parameter(self, offset: int) -> str | None:
        """The parameter the argument under `offset` fills (for signature help)."""
        args = self.call.args
        names = [n for n, _ in self.bound]
        positional = 1 if self.receiver is not None else 0
        for arg in args:
            if arg.name is None:
                if arg.span.end >= offset or arg is args[-1]:
                    return names[positional] if positional < len(names) else None
                positional += 1
            elif arg.span.start <= offset <= arg.span.end:
                return arg.name
        return names[positional] if positional < len(names) else None


@dataclass
class Analysis:
    """Everything `analyze()` learnt about one file.

    Query methods take 0-based character offsets into the source."""

    path: str | None
    source: str
    module: ast.Module
    diagnostics: list[Diagnostic] = field(default_factory=list)
    definitions: list[Definition] = field(default_factory=list)
    references: list[Reference] = field(default_factory=list)
    scopes: list[ScopeInfo] = field(default_factory=list)
    expr_types: dict[int, tuple[ast.Expr, Type]] = field(default_factory=dict)
    calls: dict[int, CallInfo] = field(default_factory=dict)
    enum_values: dict[int, tuple[str, str]] = field(default_factory=dict)
    """id(Name or Member node) -> (enum name, member name) for enum member references."""
    imports: dict[int, Analysis] = field(default_factory=dict)
    """id(Import node) -> the analysis of the imported file."""
    record_fields: dict[str, tuple[ast.FieldDecl, ...]] = field(default_factory=dict)
    field_types: dict[str, dict[str, Type]] = field(default_factory=dict)
    """Field types of the records this file declares or imports."""
    signatures: dict[int, tuple[list[Param], Type]] = field(default_factory=dict)
    """id(FnDecl or RecordDecl) -> (parameters, return type), also for imported declarations."""

    @property
    def errors(self) -> list[Diagnostic]:
        return [d for d in self.diagnostics if d.is_error]

    def scope_at(self, offset: int) -> dict[str, Definition]:
        """The user definitions visible at `offset` (innermost wins); `let`s declared later in the
        same file are not visible yet. Builtins come from `aner_lang.builtins.registry()`."""
        best: ScopeInfo | None = None
        for scope in self.scopes:
            if scope.span is None or scope.span.start <= offset <= scope.span.end:
                if best is None or (
                    scope.span is not None
                    and (best.span is None or scope.span.start >= best.span.start)
                ):
                    best = scope
        visible: dict[str, Definition] = {}
        while best is not None:
            for name, d in best.names.items():
                if name in visible:
                    continue
                later = d.path == self.path and d.span is not None and d.span.start > offset
                if not later or d.kind in ("fn", "record", "enum"):
                    visible[name] = d
            best = best.parent
        return visible

    def type_at(self, offset: int) -> str | None:
        """The type of the innermost expression covering `offset`."""
        found = self._innermost(offset, ((e.span, t) for e, t in self.expr_types.values()))
        return None if found is None else str(found)

    def definition_at(self, offset: int) -> Definition | None:
        """The definition named at `offset` (a reference or the defining name itself)."""
        for ref in self.references:
            if ref.span.start <= offset <= ref.span.end:
                return ref.definition
        for d in self.definitions:
            if d.span is not None and d.span.start <= offset <= d.span.end and d.path == self.path:
                return d
        return None

    def references_to(self, definition: Definition) -> list[Reference]:
        return [r for r in self.references if r.definition is definition]

    def call_at(self, offset: int) -> CallInfo | None:
        """The innermost call whose parentheses contain `offset`."""
        return self._innermost(
            offset,
            ((c.call.open_span, c) for c in self.calls.values() if c.call.open_span.start < offset),
        )

    @staticmethod
    def _innermost(offset: int, items: Iterable[tuple[Span, _V]]) -> _V | None:
        """The value whose span is the smallest one containing `offset`."""
        best: _V | None = None
        best_len: int | None = None
        for span, value in items:
            if span.start <= offset <= span.end and (
                best_len is None or span.end - span.start < best_len
            ):
                best, best_len = value, span.end - span.start
        return best

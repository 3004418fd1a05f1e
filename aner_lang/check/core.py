"""The checker's state and the services every part of it uses: reporting, definitions and uses,
the lifetime of scopes, and type names.

The checker is one class assembled in layers, each in its own module and each a subclass of the
one before: `CheckerCore` (here) -> `ExpressionChecker` (`expressions.py`) -> `CallChecker`
(`calls.py`) -> `StatementChecker` (`statements.py`) -> `Checker` (`checker.py`: a module, its
hoisted declarations and its imports).

Rules kept here:

* Reporting: a diagnostic is kept unless the checker is *muted* (while it tries an overload
  candidate speculatively, or probes a type for a message). `errors` counts every error
  reported, muted or not, so a caller can tell whether checking an expression found a mistake.
* Definitions: defining a name twice in one scope is an error. Definitions and references are
  recorded in the `Analysis` (for the LSP) only while not muted.
* Unused names: when a scope closes, a `let`, parameter or `for` variable of this file that was
  never read and whose name does not start with `_` is reported; names at the top level only when
  `warn_unused_top` (an imported file's top level is used by its importers, not by itself).
* Type names in source resolve to a primitive, `List[T]`, a record or enum in scope, or a
  registry enum or type; an unknown name is reported and becomes `Any`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import cache

from aner_lang.builtins import Registry
from aner_lang.check import types as T
from aner_lang.check.analysis import Analysis, Definition, Reference
from aner_lang.check.scopes import EnclosingFn, Scope
from aner_lang.grammar import ast, parse_expression
from aner_lang.grammar.ast import Span
from aner_lang.problems import diagnostics as msg
from aner_lang.problems.diagnostics import Diagnostic

Resolver = Callable[[str, "str | None"], "tuple[str, str]"]
"""resolver(import path as written, importing file) -> (resolved path, source); raises
`AnerRuntimeError` (an `E-FILE-*` code) for a file it cannot read."""


@cache
def registry_expr(text: str) -> ast.Expr:
    """A default or constraint of the registry, parsed once per process."""
    return parse_expression(text)


@dataclass
class Param:
    """A parameter as the binder sees it (from a builtin, a user fn or a record field)."""

    name: str
    ty: T.Type
    default: ast.Expr | None
    required: bool
    keyword_only: bool = False


class CheckerCore:
    def __init__(
        self,
        registry: Registry,
        analysis: Analysis,
        resolver: Resolver,
        import_stack: tuple[str, ...],
        cache: dict[str, Analysis],
        warn_unused_top: bool,
    ) -> None:
        self.reg = registry
        self.a = analysis
        self.path = analysis.path
        self.resolver = resolver
        self.import_stack = import_stack
        self.cache = cache
        self.warn_unused_top = warn_unused_top
        self.diags = analysis.diagnostics
        self.enum_types: dict[str, T.EnumT] = {
            e.name: T.EnumT(e.name, tuple(m.name for m in e.members))
            for e in registry.enums.values()
        }
        self.enum_members = frozenset(m for et in self.enum_types.values() for m in et.members)
        """Every member of a registry enum (a constant in registry constraints)."""
        self.fields: dict[str, dict[str, T.Type]] = {td.name: {} for td in registry.types.values()}
        """Field types of every named type: the registry's, then the records declared or imported."""
        for td in registry.types.values():
            self.fields[td.name] = {f.name: self.spec_type(f.type) for f in td.fields}
        self.record_params: dict[str, list[Param]] = {}
        self.fn_params: dict[int, list[Param]] = {}
        self.fn_returns: dict[int, T.Type] = {}
        self.builtin_sigs: dict[int, tuple[list[Param], T.Type]] = {}
        """id(Builtin) -> its parameters and return type as the checker's types."""
        self.muted = 0
        self.errors = 0
        self.speculation: dict[tuple[int, int, T.Type | None], tuple[T.Type, int]] = {}
        """Muted expression checks: (id(expr), id(scope), expected) -> (type, errors reported)
        (see `ExpressionChecker.speculative_expr`)."""

    # ---- diagnostics ------------------------------------------------------------------------
    def report(self, d: Diagnostic) -> None:
        if d.is_error:
            self.errors += 1
        if not self.muted:
            self.diags.append(d.at(self.path))

    # ---- types --------------------------------------------------------------------------------
    def spec_type(self, text: str) -> T.Type:
        """The type a registry type string means."""
        return T.registry_type(text, self.enum_types, self.fields)

    def resolve_type(self, t: ast.TypeExpr, scope: Scope) -> T.Type:
        """The type a type written in source means (`Any` after reporting an unknown name)."""
        if isinstance(t, ast.OptionalType):
            return T.optional(self.resolve_type(t.inner, scope))
        if t.name == "List":
            if len(t.args) != 1:
                self.report(msg.bad_type_args(t.span, "List", 1, len(t.args)))
                return T.ANY
            return T.ListT(self.resolve_type(t.args[0], scope))
        if t.args:
            self.report(msg.bad_type_args(t.span, t.name, 0, len(t.args)))
        if t.name in T.PRIMITIVES:
            return T.PRIMITIVES[t.name]
        d = scope.lookup(t.name)
        if d is not None and d.kind in ("record", "enum"):
            self.use(d, t.span)
            return d.ty
        if t.name in self.enum_types:
            return self.enum_types[t.name]
        if t.name in self.reg.types:
            return T.NamedT(t.name)
        names = (
            list(T.PRIMITIVES)
            + ["List"]
            + list(self.enum_types)
            + list(self.reg.types)
            + scope.visible_of_kind("record", "enum")
        )
        self.report(msg.unknown_type(t.span, t.name, names))
        return T.ANY

    # ---- definitions and scopes -----------------------------------------------------------------
    def define(
        self, scope: Scope, name: str, kind: str, ty: T.Type, span: Span, node: object
    ) -> Definition:
        d = Definition(name, kind, ty, span, self.path, node)
        prev = scope.names.get(name)
        if prev is not None:
            self.report(
                msg.duplicate_definition(span, name, prev.span if prev.path == self.path else None)
            )
        scope.names[name] = d
        if not self.muted:
            self.a.definitions.append(d)
        return d

    def use(self, d: Definition, span: Span) -> None:
        """`d` is read at `span`."""
        d.used = True
        self.reference(d, span)

    def reference(self, d: Definition, span: Span) -> None:
        """`d` is named at `span` (read or assigned: an assignment alone does not use a name)."""
        if not self.muted:
            self.a.references.append(Reference(span, d))

    def new_scope(self, parent: Scope, span: Span, fn: EnclosingFn | None = None) -> Scope:
        scope = Scope(parent, span, fn)
        self.a.scopes.append(scope.info)
        return scope

    def close_scope(self, scope: Scope) -> None:
        if scope.parent is None and not self.warn_unused_top:
            return
        for d in scope.names.values():
            if (
                d.kind in ("let", "param", "for")
                and not d.used
                and not d.name.startswith("_")
                and d.path == self.path
                and d.span is not None
            ):
                self.report(msg.unused_binding(d.span, d.name))

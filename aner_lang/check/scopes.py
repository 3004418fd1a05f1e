"""Lexical scopes: which definition a name means at a point of the script.

A scope belongs to the file (the top level) or to a block; a name resolves in the innermost scope
that defines it. A scope also records the optional names known not to be `none` inside it
(`if x != none { ... }` narrows `x` in the then-branch), and the function whose body it is in, so
that `return` knows its expected type.
"""

from __future__ import annotations

from aner_lang.check import types as T
from aner_lang.check.analysis import Definition, ScopeInfo
from aner_lang.grammar import ast
from aner_lang.grammar.ast import Span

EnclosingFn = tuple[ast.FnDecl, T.Type]
"""The function a scope is inside, with its declared return type."""


class Scope:
    def __init__(self, parent: Scope | None, span: Span | None, fn: EnclosingFn | None) -> None:
        self.parent = parent
        self.names: dict[str, Definition] = {}
        self.narrowed: dict[str, T.Type] = {}
        """Optional names known not to be none here (inside `if x != none { ... }`)."""
        self.span = span
        self.fn: EnclosingFn | None = fn if fn is not None else (parent.fn if parent else None)
        self.info: ScopeInfo = ScopeInfo(span, self.names, parent.info if parent else None)

    def lookup(self, name: str) -> Definition | None:
        scope: Scope | None = self
        while scope is not None:
            d = scope.names.get(name)
            if d is not None:
                return d
            scope = scope.parent
        return None

    def narrowed_type(self, name: str) -> T.Type | None:
        """The narrowed type of `name` here, unless an inner scope defines `name` afresh."""
        scope: Scope | None = self
        while scope is not None:
            if name in scope.narrowed:
                return scope.narrowed[name]
            if name in scope.names:
                return None
            scope = scope.parent
        return None

    def visible(self) -> list[str]:
        """Every name defined here or outside, innermost first (a shadowed name appears again)."""
        out: list[str] = []
        scope: Scope | None = self
        while scope is not None:
            out += scope.names
            scope = scope.parent
        return out

    def visible_of_kind(self, *kinds: str) -> list[str]:
        """The `visible` names whose definition here is of one of `kinds` (`fn`, `record`, ...)."""
        out = []
        for name in self.visible():
            d = self.lookup(name)
            if d is not None and d.kind in kinds:
                out.append(name)
        return out

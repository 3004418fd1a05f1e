"""Checking statements, in source order.

Rules:

* `let x = v` defines `x` with the type of `v`, or with its annotation, which `v` must fit. A
  value of type None or an empty list says too little: it needs an annotation.
* `x = v` assigns to an existing `let` (not to a parameter, a loop variable or a declaration);
  `v` must fit its type.
* `fn`, `record`, `enum` and `import` belong at the top level. A function's parameter defaults
  must fit their types, and a function that declares a return type must end in a `return` on
  every path (an `if` with an `else`, both returning, counts; so does `assert false`).
* Conditions and assertions are Bool, an assertion message a String; `for` iterates a list.
* `if x != none` narrows an optional `x` to its inner type in the then-branch, `if x == none` in
  the else-branch.
* `return` is only inside a function, and its value must fit the function's return type.
"""

from __future__ import annotations

from collections.abc import Sequence

from aner_lang.check import types as T
from aner_lang.check.calls import CallChecker
from aner_lang.check.scopes import EnclosingFn, Scope
from aner_lang.grammar import ast
from aner_lang.grammar.ast import Span
from aner_lang.problems import diagnostics as msg

NewDefinition = tuple[str, str, T.Type, Span, object]
"""A name a block defines on entry: name, kind, type, span of the name, declaring node."""

Narrowing = dict[str, T.Type]
"""Optional names known not to be none in a branch, with their inner types."""


class StatementChecker(CallChecker):
    def block(
        self,
        b: ast.Block,
        parent: Scope,
        fn: EnclosingFn | None = None,
        params: Sequence[NewDefinition] = (),
        narrowed: Narrowing | None = None,
    ) -> Scope:
        scope = self.new_scope(parent, b.span, fn)
        scope.narrowed.update(narrowed or {})
        for p in params:
            self.define(scope, *p)
        for s in b.body:
            self.stmt(s, scope)
        self.close_scope(scope)
        return scope

    def stmt(self, s: ast.Stmt, scope: Scope) -> None:
        if isinstance(s, ast.Let):
            self.let(s, scope)
        elif isinstance(s, ast.Assign):
            self.assign(s, scope)
        elif isinstance(s, ast.FnDecl):
            self.fn_decl(s, scope)
        elif isinstance(s, (ast.RecordDecl, ast.EnumDecl)):
            if scope.parent is not None:
                self.report(
                    msg.declaration_not_top_level(
                        s.span, "record" if isinstance(s, ast.RecordDecl) else "enum"
                    )
                )
        elif isinstance(s, ast.If):
            self.expect(s.cond, T.BOOL, scope, "the condition")
            then_narrow, else_narrow = _narrowing(s.cond, scope)
            self.block(s.then, scope, narrowed=then_narrow)
            if isinstance(s.orelse, ast.Block):
                self.block(s.orelse, scope, narrowed=else_narrow)
            elif s.orelse is not None:
                self.stmt(s.orelse, scope)
        elif isinstance(s, ast.For):
            self.for_stmt(s, scope)
        elif isinstance(s, ast.Return):
            self.return_stmt(s, scope)
        elif isinstance(s, ast.Assert):
            self.expect(s.cond, T.BOOL, scope, "the assertion")
            if s.message is not None:
                self.expect(s.message, T.STRING, scope, "the assertion message")
        elif isinstance(s, ast.Import):
            if scope.parent is not None:
                self.report(msg.declaration_not_top_level(s.span, "import"))
        elif isinstance(s, ast.ExprStmt):
            self.expr(s.expr, scope, None)

    def let(self, s: ast.Let, scope: Scope) -> None:
        expected = self.resolve_type(s.annotation, scope) if s.annotation is not None else None
        ty = self.expr(s.value, scope, expected)
        if expected is not None:
            self.fits(s.value, ty, expected, f"`{s.name}`")
            ty = expected
        elif ty == T.NONE or (isinstance(ty, T.ListT) and ty.elem == T.NEVER):
            self.report(msg.need_annotation(s.name_span, s.name))
            ty = T.ANY
        self.define(scope, s.name, "let", ty, s.name_span, s)

    def assign(self, s: ast.Assign, scope: Scope) -> None:
        d = scope.lookup(s.name)
        ty = self.expr(s.value, scope, d.ty if d else None)
        if d is None:
            self.report(msg.unknown_name(s.name_span, s.name, scope.visible()))
        elif d.kind != "let":
            self.report(msg.assign_to_non_variable(s.name_span, s.name, d.kind))
        else:
            self.reference(d, s.name_span)
            self.fits(s.value, ty, d.ty, f"`{s.name}`")

    def fn_decl(self, s: ast.FnDecl, scope: Scope) -> None:
        """A function's body (its signature was resolved when the module's declarations were
        hoisted)."""
        if scope.parent is not None:
            self.report(msg.declaration_not_top_level(s.span, "function"))
            return
        ret = self.fn_returns[id(s)]
        sig = self.fn_params[id(s)]
        for p, param in zip(s.params, sig):
            if p.default is not None:
                self.expect(p.default, param.ty, scope, f"default of `{p.name}`")
        params = [(p.name, "param", param.ty, p.name_span, p) for p, param in zip(s.params, sig)]
        self.block(s.body, scope, (s, ret), params)
        if ret != T.NONE and not _always_returns(s.body):
            self.report(msg.missing_return(s.name_span, s.name, str(ret)))

    def for_stmt(self, s: ast.For, scope: Scope) -> None:
        ity = self.expr(s.iterable, scope, None)
        if isinstance(ity, T.ListT):
            elem = ity.elem
        elif ity == T.ANY:
            elem = T.ANY
        else:
            self.report(
                msg.type_mismatch(s.iterable.span, "List[...]", str(ity), "the loop's iterable")
            )
            elem = T.ANY
        self.block(s.body, scope, None, [(s.var, "for", elem, s.var_span, s)])

    def return_stmt(self, s: ast.Return, scope: Scope) -> None:
        if scope.fn is None:
            self.report(msg.return_outside_fn(s.span))
            if s.value is not None:
                self.expr(s.value, scope, None)
            return
        _fn, ret = scope.fn
        if s.value is None:
            if ret != T.NONE:
                self.report(msg.type_mismatch(s.span, str(ret), "None", "the returned value"))
        else:
            self.expect(s.value, ret, scope, "the returned value")


def _narrowing(cond: ast.Expr, scope: Scope) -> tuple[Narrowing, Narrowing]:
    """`x != none` narrows an optional `x` in the then-branch, `x == none` in the else-branch."""
    if (
        isinstance(cond, ast.Binary)
        and cond.op in ("==", "!=")
        and isinstance(cond.right, ast.NoneLit)
        and isinstance(cond.left, ast.Name)
    ):
        d = scope.lookup(cond.left.name)
        if d is not None and isinstance(d.ty, T.OptionalT):
            narrowed = {cond.left.name: d.ty.inner}
            return (narrowed, {}) if cond.op == "!=" else ({}, narrowed)
    return {}, {}


def _always_returns(b: ast.Block) -> bool:
    """Whether every path through `b` ends in a `return` (or `assert false`)."""
    if not b.body:
        return False
    last = b.body[-1]
    if isinstance(last, ast.Return):
        return True
    if isinstance(last, ast.If) and last.orelse is not None:
        other = (
            last.orelse
            if isinstance(last.orelse, ast.Block)
            else ast.Block(last.orelse.span, (last.orelse,))
        )
        return _always_returns(last.then) and _always_returns(other)
    if isinstance(last, ast.Assert) and isinstance(last.cond, ast.BoolLit) and not last.cond.value:
        return True
    return False

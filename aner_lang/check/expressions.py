"""Checking expressions: every expression gets a type, recorded in `Analysis.expr_types`.

Rules:

* Bidirectional: an expected type flows into an expression. That is how a bare enum member
  resolves (`storage: nf4_double_quant` where a `Storage` is expected, `[q_proj, v_proj]` where a
  `List[Target]` is) and how a list literal takes the element type it is assigned to.
* An erroneous expression has type `Any`, which fits everywhere, so one mistake reports once.
* A list literal's element type is the join of its items' types (`[1, none]` is `List[Int?]`).
* Operators: arithmetic on Int and Float (Int op Int is Int, `/` is always Float), `+` joins
  strings, bytes and lists of one type, byte sizes add, subtract, divide and scale by an Int,
  comparisons order numbers, strings and bytes, `==`/`!=` need one side to fit the other,
  `and`/`or`/`not` take Bool.
* `E.m` names a member of enum `E`; `x.f` reads field `f` of a record or builtin type (of an
  optional one too); `xs[i]` indexes a list or a string with an Int.
* Calls are checked by `CallChecker` (`calls.py`).
"""

from __future__ import annotations

from abc import ABC, abstractmethod

from aner_lang.check import types as T
from aner_lang.check.core import CheckerCore
from aner_lang.check.scopes import Scope
from aner_lang.grammar import ast
from aner_lang.problems import diagnostics as msg
from aner_lang.problems.diagnostics import Diagnostic

_COMPARE = ("<", "<=", ">", ">=")


class ExpressionChecker(CheckerCore, ABC):
    @abstractmethod
    def call(self, e: ast.Call, scope: Scope, expected: T.Type | None) -> T.Type:
        """The type of a call (binding, overloads and constraints: `CallChecker`)."""

    def expect(self, e: ast.Expr, expected: T.Type, scope: Scope, what: str) -> T.Type:
        """Check `e` where a value of type `expected` is needed; `what` names it in the message."""
        ty = self.expr(e, scope, expected)
        self.fits(e, ty, expected, what)
        return ty

    def fits(self, e: ast.Expr, ty: T.Type, expected: T.Type, what: str) -> bool:
        if T.assign_cost(ty, expected) is None:
            self.report(msg.type_mismatch(e.span, str(expected), str(ty), what))
            return False
        return True

    def expr(self, e: ast.Expr, scope: Scope, expected: T.Type | None) -> T.Type:
        if self.muted:
            return self.speculative_expr(e, scope, expected)
        if self.speculation:
            self.speculation.clear()
        ty = self._expr(e, scope, expected)
        self.a.expr_types[id(e)] = (e, ty)
        return ty

    def speculative_expr(self, e: ast.Expr, scope: Scope, expected: T.Type | None) -> T.Type:
        """`expr` while muted, remembered: overload resolution checks each argument once per
        candidate, and an argument that is itself an overloaded call does the same, so without
        the memo nested calls (`abs(abs(abs(...)))`) take time exponential in their depth. A
        muted check records nothing but its type and its error count, and within one muted
        stretch (no statement is checked in it, no scope opens or closes) the same expression
        in the same scope with the same expected type always gets the same; the memo is
        dropped when checking goes back to unmuted."""
        key = (id(e), id(scope), expected)
        known = self.speculation.get(key)
        if known is not None:
            self.errors += known[1]
            return known[0]
        errors = self.errors
        ty = self._expr(e, scope, expected)
        self.speculation[key] = (ty, self.errors - errors)
        return ty

    def _expr(self, e: ast.Expr, scope: Scope, expected: T.Type | None) -> T.Type:
        if isinstance(e, ast.IntLit):
            return T.INT
        if isinstance(e, ast.FloatLit):
            return T.FLOAT
        if isinstance(e, ast.BoolLit):
            return T.BOOL
        if isinstance(e, ast.BytesLit):
            return T.BYTES
        if isinstance(e, ast.NoneLit):
            return T.NONE
        if isinstance(e, ast.StringLit):
            for p in e.parts:
                if not isinstance(p, str):
                    self.expr(p, scope, None)
            return T.STRING
        if isinstance(e, ast.Name):
            return self.name(e, scope, expected)
        if isinstance(e, ast.ListLit):
            return self.list_lit(e, scope, expected)
        if isinstance(e, ast.Unary):
            return self.unary(e, scope)
        if isinstance(e, ast.Binary):
            return self.binary(e, scope)
        if isinstance(e, ast.Call):
            return self.call(e, scope, expected)
        if isinstance(e, ast.Member):
            return self.member(e, scope)
        if isinstance(e, ast.Index):
            return self.index(e, scope)
        raise AssertionError(f"unhandled expression {type(e).__name__}")

    def list_lit(self, e: ast.ListLit, scope: Scope, expected: T.Type | None) -> T.Type:
        want = expected.inner if isinstance(expected, T.OptionalT) else expected
        elem_expected = want.elem if isinstance(want, T.ListT) else None
        elem: T.Type = T.NEVER
        for item in e.items:
            ity = self.expr(item, scope, elem_expected)
            joined = T.join(ity, elem)
            if joined is None:
                self.report(msg.type_mismatch(item.span, str(elem), str(ity), "list item"))
            else:
                elem = joined
        if elem_expected is not None and T.assign_cost(elem, elem_expected) is not None:
            return T.ListT(elem_expected)
        return T.ListT(elem)

    def unary(self, e: ast.Unary, scope: Scope) -> T.Type:
        ty = self.expr(e.operand, scope, T.BOOL if e.op == "not" else None)
        if e.op == "not":
            if ty not in (T.BOOL, T.ANY):
                self.report(msg.bad_operands(e.span, "not", str(ty)))
            return T.BOOL
        if ty in (T.INT, T.FLOAT, T.BYTES, T.ANY):
            return ty
        self.report(msg.bad_operands(e.span, "-", str(ty)))
        return T.ANY

    def index(self, e: ast.Index, scope: Scope) -> T.Type:
        oty = self.expr(e.obj, scope, None)
        self.expect(e.index, T.INT, scope, "the index")
        if isinstance(oty, T.ListT):
            return oty.elem
        if oty in (T.STRING, T.ANY):
            return oty
        self.report(msg.not_indexable(e.obj.span, str(oty)))
        return T.ANY

    def name(self, e: ast.Name, scope: Scope, expected: T.Type | None) -> T.Type:
        d = scope.lookup(e.name)
        want = expected.inner if isinstance(expected, T.OptionalT) else expected
        if d is not None and d.kind in ("let", "param", "for"):
            self.use(d, e.span)
            return scope.narrowed_type(e.name) or d.ty
        if isinstance(want, T.EnumT) and e.name in want.members:
            if not self.muted:
                self.a.enum_values[id(e)] = (want.name, e.name)
            return want
        if d is not None:
            self.use(d, e.span)
            note = f"name one of its members: `{e.name}.member`" if d.kind == "enum" else None
            self.report(
                Diagnostic(
                    "E-TYPE",
                    e.span,
                    f"`{e.name}` is a{'n' if d.kind == 'enum' else ''} {d.kind}, not a value",
                    notes=(note,) if note else (),
                )
            )
            return T.ANY
        if isinstance(want, T.EnumT):
            self.report(msg.unknown_member(e.span, want.name, e.name, want.members))
            return want
        if e.name in self.reg.functions:
            self.report(
                Diagnostic("E-TYPE", e.span, f"builtin function `{e.name}` is not a value; call it")
            )
            return T.ANY
        self.report(msg.unknown_name(e.span, e.name, scope.visible() + list(self.reg.functions)))
        return T.ANY

    def member(self, e: ast.Member, scope: Scope) -> T.Type:
        enum = self.enum_type_named(e.obj, scope)
        if enum is not None:
            if e.name not in enum.members:
                self.report(msg.unknown_member(e.name_span, enum.name, e.name, enum.members))
            elif not self.muted:
                self.a.enum_values[id(e)] = (enum.name, e.name)
            return enum
        oty = self.expr(e.obj, scope, None)
        base = oty.inner if isinstance(oty, T.OptionalT) else oty
        if base == T.ANY:
            return T.ANY
        if isinstance(base, T.NamedT) and base.name in self.fields:
            fields = self.fields[base.name]
            if e.name in fields:
                return fields[e.name]
            self.report(msg.unknown_field(e.name_span, base.name, e.name, fields))
            return T.ANY
        self.report(msg.unknown_field(e.name_span, str(oty), e.name, ()))
        return T.ANY

    def enum_type_named(self, e: ast.Expr, scope: Scope) -> T.EnumT | None:
        """The enum `e` names, when it is the name of a user or registry enum."""
        if not isinstance(e, ast.Name):
            return None
        d = scope.lookup(e.name)
        if d is not None:
            if d.kind == "enum" and isinstance(d.ty, T.EnumT):
                self.use(d, e.span)
                return d.ty
            return None
        return self.enum_types.get(e.name)

    def binary(self, e: ast.Binary, scope: Scope) -> T.Type:
        op = e.op
        if op in ("and", "or"):
            self.expect(e.left, T.BOOL, scope, f"the left side of `{op}`")
            self.expect(e.right, T.BOOL, scope, f"the right side of `{op}`")
            return T.BOOL
        lt = self.expr(e.left, scope, None)
        rt = self.expr(e.right, scope, lt if isinstance(lt, T.EnumT) else None)
        result = _binary_type(op, lt, rt)
        if result is None:
            self.report(msg.bad_operands(e.op_span, op, str(lt), str(rt)))
            return T.BOOL if op in ("==", "!=", "<", "<=", ">", ">=") else T.ANY
        return result


def _binary_type(op: str, lt: T.Type, rt: T.Type) -> T.Type | None:
    """The type of `lt op rt`, or None when the operator does not apply to these operands."""
    if T.ANY in (lt, rt):
        return T.BOOL if op in _COMPARE or op in ("==", "!=") else T.ANY
    if op in ("==", "!="):
        if T.assign_cost(lt, rt) is not None or T.assign_cost(rt, lt) is not None:
            return T.BOOL
        return None
    num = lt in T.NUMERIC and rt in T.NUMERIC
    if op in _COMPARE:
        if num or (lt == rt and lt in (T.BYTES, T.STRING)):
            return T.BOOL
        return None
    if op == "/":
        return T.FLOAT if num or (lt == rt == T.BYTES) else None
    if num:
        return T.INT if lt == rt == T.INT else T.FLOAT
    if op == "+" and lt == rt and (lt in (T.STRING, T.BYTES) or isinstance(lt, T.ListT)):
        return lt
    if op == "-" and lt == rt == T.BYTES:
        return T.BYTES
    if op == "*" and {lt, rt} == {T.BYTES, T.INT}:
        return T.BYTES
    return None

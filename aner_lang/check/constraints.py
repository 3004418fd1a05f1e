"""Registry constraints checked before the run, on the arguments known before it.

A builtin's constraints (`rank >= 1`) are Aner boolean expressions over its parameter names. The
checker evaluates each one with the values known statically: an argument that is a constant
expression (literals, registry enum members and operators over them) or, for a parameter left
out, its default. An argument whose own checking reported an error has no value here (its
mistake is reported once). A constraint that evaluates to false is reported at the first argument
it mentions, else at the call. What cannot be evaluated statically (`consteval.STATIC_FAILURES`)
is left to the interpreter, which checks every constraint again before calling the builtin; any
other exception is a bug in Aner and propagates.
"""

from __future__ import annotations

from collections.abc import Container, Mapping, Sequence
from typing import Any

from aner_lang.builtins.spec import Builtin
from aner_lang.check.consteval import STATIC_FAILURES, evaluate
from aner_lang.check.core import Param, registry_expr
from aner_lang.grammar import ast
from aner_lang.problems import diagnostics as msg
from aner_lang.problems.diagnostics import Diagnostic


def constraint_failures(
    call: ast.Call,
    name: str,
    builtin: Builtin,
    params: Sequence[Param],
    bound: Mapping[str, ast.Expr],
    flawed: Container[str],
    enum_members: frozenset[str],
) -> list[Diagnostic]:
    """The constraints of `builtin` that a call with these arguments (`bound`, by parameter name;
    `flawed`: the parameters whose argument had an error) statically fails."""
    env: dict[str, Any] = {}
    for p in params:
        if p.name in flawed:
            continue
        expr = bound.get(p.name, p.default)
        if expr is None:
            continue
        try:
            env[p.name] = evaluate(expr, {}, enum_members)
        except STATIC_FAILURES:
            continue
    failures = []
    for c in builtin.constraints:
        check = registry_expr(c.expr)
        try:
            ok = evaluate(check, env, enum_members)
        except STATIC_FAILURES:
            continue
        if not ok:
            mentioned = [p.name for p in params if p.name in bound and _mentions(check, p.name)]
            span = bound[mentioned[0]].span if mentioned else call.span
            failures.append(msg.constraint_failed(span, name, c.message, c.expr))
    return failures


def _mentions(expr: ast.Expr, name: str) -> bool:
    """Whether `name` occurs in a constraint (names, unary and binary operators)."""
    if isinstance(expr, ast.Name):
        return expr.name == name
    if isinstance(expr, ast.Binary):
        return _mentions(expr.left, name) or _mentions(expr.right, name)
    if isinstance(expr, ast.Unary):
        return _mentions(expr.operand, name)
    return False

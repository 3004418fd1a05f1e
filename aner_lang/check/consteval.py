"""Operator semantics shared by the checker's constant folding (registry constraints over literal
arguments) and the interpreter, so that both agree on what `rank >= 1` means."""

from __future__ import annotations

import math
import operator
from collections.abc import Mapping
from typing import Any

from aner_lang.errors import AnerRuntimeError
from aner_lang.grammar import ast


class NotConstant(Exception):
    """The expression mentions something that is not known before the script runs."""


STATIC_FAILURES: tuple[type[Exception], ...] = (
    NotConstant,
    AnerRuntimeError,
    OverflowError,
    ValueError,
)
"""What `evaluate` may raise on a well-typed expression: it is not a constant (NotConstant), or
running it fails, which the run reports (division or modulo by zero: AnerRuntimeError; an Int too
large for a Float: OverflowError; `%` of an infinite Float: ValueError). Any other exception from
a well-typed expression is a bug."""


def _div(a: float, b: float) -> float:
    if b == 0:
        raise AnerRuntimeError("division by zero", code="E-DIV-ZERO")
    return a / b  # always true division: `/` gives a Float


def _mod(a: float, b: float) -> float:
    if b == 0:
        raise AnerRuntimeError("modulo by zero", code="E-DIV-ZERO")
    return math.fmod(a, b) if isinstance(a, float) or isinstance(b, float) else a % b


BINARY = {
    "+": operator.add,
    "-": operator.sub,
    "*": operator.mul,
    "/": _div,
    "%": _mod,
    "==": operator.eq,
    "!=": operator.ne,
    "<": operator.lt,
    "<=": operator.le,
    ">": operator.gt,
    ">=": operator.ge,
}


def apply_binary(op: str, a: Any, b: Any) -> Any:
    """`a op b` for non-short-circuit operators."""
    return BINARY[op](a, b)


def evaluate(
    expr: ast.Expr, env: Mapping[str, Any], enum_members: frozenset[str] = frozenset()
) -> Any:
    """Evaluate a constant expression. Names come from `env`; a name that is an enum member stands
    for its member name (how enum values cross into the runtime). Raises NotConstant otherwise."""
    if isinstance(expr, (ast.IntLit, ast.FloatLit, ast.BoolLit, ast.BytesLit)):
        return expr.value
    if isinstance(expr, ast.NoneLit):
        return None
    if isinstance(expr, ast.StringLit):
        text = [p for p in expr.parts if isinstance(p, str)]
        if len(text) < len(expr.parts):  # it interpolates an expression
            raise NotConstant
        return "".join(text)
    if isinstance(expr, ast.Name):
        if expr.name in env:
            return env[expr.name]
        if expr.name in enum_members:
            return expr.name
        raise NotConstant
    if isinstance(expr, ast.ListLit):
        return [evaluate(i, env, enum_members) for i in expr.items]
    if isinstance(expr, ast.Unary):
        value = evaluate(expr.operand, env, enum_members)
        return (not value) if expr.op == "not" else -value
    if isinstance(expr, ast.Binary):
        left = evaluate(expr.left, env, enum_members)
        if expr.op == "and":
            return left and evaluate(expr.right, env, enum_members)
        if expr.op == "or":
            return left or evaluate(expr.right, env, enum_members)
        right = evaluate(expr.right, env, enum_members)
        if left is None or right is None:
            if expr.op in ("==", "!="):
                return (left is right) == (expr.op == "==")
            return True  # an absent optional satisfies every other constraint
        return apply_binary(expr.op, left, right)
    if (
        isinstance(expr, ast.Member)
        and isinstance(expr.obj, ast.Name)
        and expr.name in enum_members
    ):
        return expr.name
    raise NotConstant

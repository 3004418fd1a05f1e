"""Operator semantics shared by the checker's constant folding (registry constraints over literal
arguments) and the interpreter, so that both agree on what `rank >= 1` means."""

from __future__ import annotations

import math
import operator
from collections.abc import Mapping
from typing import Any

from aner_lang.grammar import ast
from aner_lang.grammar.limits import INT_MAX, INT_MIN, MAX_CHARS, MAX_ITEMS
from aner_lang.problems.errors import AnerRuntimeError


class NotConstant(Exception):
    """The expression mentions something that is not known before the script runs."""


STATIC_FAILURES: tuple[type[Exception], ...] = (NotConstant, AnerRuntimeError)
"""What `evaluate` may raise on a well-typed expression: it is not a constant (NotConstant), or
running it fails, which the run reports (division or modulo by zero, an overflow: an
AnerRuntimeError). Any other exception from a well-typed expression is a bug."""


def _div(a: float, b: float) -> float:
    if b == 0:
        raise AnerRuntimeError("division by zero", code="E-DIV-ZERO")
    return a / b  # always true division: `/` gives a Float


def _mod(a: float, b: float) -> float:
    if b == 0:
        raise AnerRuntimeError("modulo by zero", code="E-DIV-ZERO")
    if isinstance(a, float) or isinstance(b, float):
        return math.fmod(a, b) if math.isfinite(a) else math.nan
    return a % b


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
    """`a op b` for non-short-circuit operators, checked: an Int result outside the 64-bit range,
    a Float result that is infinite or NaN from finite operands, a string or a list larger than
    its bound, each is an error (see `aner_lang.grammar.limits`)."""
    result = BINARY[op](a, b)
    kind = type(result)
    if kind is int:
        if not INT_MIN <= result <= INT_MAX:
            raise overflow(f"{a} {op} {b}")
    elif kind is float:
        if not math.isfinite(result) and math.isfinite(a) and math.isfinite(b):
            raise overflow(f"{a!r} {op} {b!r}")
    elif kind is str:
        check_size(len(result), MAX_CHARS, "characters", f"`{op}`")
    elif kind is list:
        check_size(len(result), MAX_ITEMS, "items", f"`{op}`")
    return result


def negate(value: Any) -> Any:
    """`-value`, checked (`-(-9223372036854775808)` is not an Int)."""
    if value == INT_MIN and type(value) is int:
        raise overflow(f"-({value})")
    return -value


def overflow(what: str) -> AnerRuntimeError:
    return AnerRuntimeError(
        f"{what} overflows: the result is outside the range of its type",
        code="E-OVERFLOW",
        notes=(f"an Int is between {INT_MIN:,} and {INT_MAX:,}; a Float is finite",),
    )


def check_size(size: int, limit: int, unit: str, what: str) -> None:
    """Raise `size_error` when `what` would make a value of `size` `unit`s, more than `limit`."""
    if size > limit:
        raise size_error(size, limit, unit, what)


def size_error(size: int, limit: int, unit: str, what: str) -> AnerRuntimeError:
    return AnerRuntimeError(
        f"{what} would make a value of {size:,} {unit}, more than the {limit:,} allowed",
        code="E-LIMIT",
    )


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
        return (not value) if expr.op == "not" else negate(value)
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

"""Implementations of the core builtins declared in `aner_lang.builtins.core` (pure Python)."""

from __future__ import annotations

import builtins
import json
import math
from collections.abc import Callable
from typing import TypeVar

from aner_lang.errors import AnerRuntimeError
from aner_lang.interp.context import ExecContext
from aner_lang.interp.values import Value, show, to_plain

Number = TypeVar("Number", int, float)
"""Int or Float: `min`, `max` and `abs` have one overload for each, of the same type throughout."""
R = TypeVar("R")


def print_(ctx: ExecContext, value: Value) -> None:
    print(show(value), file=ctx.stdout)


def len_(items: list[Value] | None = None, text: str | None = None) -> int:
    """`len(items)` or `len(text)`: the overload called passes exactly one of them."""
    return len(items) if items is not None else len(text or "")


def range_(stop: int, start: int | None = None, step: int = 1) -> list[int]:
    return list(range(stop)) if start is None else list(range(start, stop, step))


def str_(value: Value) -> str:
    return show(value)


def int_(x: float) -> int:
    if math.isnan(x) or math.isinf(x):
        raise AnerRuntimeError(f"cannot convert {show(x)} to an integer", code="E-VALUE")
    return int(x)


def float_(x: int) -> float:
    return float(x)


def join(items: list[str], sep: str) -> str:
    return sep.join(items)


def split(text: str, sep: str | None) -> list[str]:
    return text.split(sep)


def min_(a: Number, b: Number) -> Number:
    return min(a, b)


def max_(a: Number, b: Number) -> Number:
    return max(a, b)


def abs_(x: Number) -> Number:
    return abs(x)


def _checked(fn: Callable[[float], R], x: float) -> R:
    try:
        return fn(x)
    except (ValueError, OverflowError) as e:
        raise AnerRuntimeError(f"{fn.__name__}({show(x)}): {e}", code="E-VALUE") from None


def sqrt(x: float) -> float:
    return _checked(math.sqrt, x)


def exp(x: float) -> float:
    return _checked(math.exp, x)


def log(x: float) -> float:
    return _checked(math.log, x)


def floor(x: float) -> int:
    return _checked(math.floor, x)


def ceil(x: float) -> int:
    return _checked(math.ceil, x)


def round(x: float) -> int:
    return _checked(builtins.round, x)


def pow_(base: float, exponent: float) -> float:
    try:
        result = math.pow(base, exponent)
    except (ValueError, OverflowError) as e:
        raise AnerRuntimeError(
            f"pow({show(base)}, {show(exponent)}): {e}", code="E-VALUE"
        ) from None
    return result


def read_text(ctx: ExecContext, path: str) -> str:
    full = ctx.resolve_path(path)
    try:
        return full.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise AnerRuntimeError(
            f"cannot read {full}: {getattr(e, 'strerror', None) or e}", code="E-IO"
        ) from None


def write_json(ctx: ExecContext, path: str, value: Value) -> None:
    if not ctx.writes_files:
        return
    full = ctx.resolve_path(path)
    try:
        full.parent.mkdir(parents=True, exist_ok=True)
        full.write_text(json.dumps(to_plain(value), indent=2, default=str) + "\n", encoding="utf-8")
    except OSError as e:
        raise AnerRuntimeError(f"cannot write {full}: {e.strerror or e}", code="E-IO") from None

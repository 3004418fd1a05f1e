"""Implementations of the core builtins declared in `aner_lang.builtins.core` (pure Python)."""

from __future__ import annotations

import builtins
import json
import math
from collections.abc import Callable
from typing import TypeVar

from aner_lang.check.consteval import check_size, negate, overflow
from aner_lang.grammar.limits import INT_MAX, INT_MIN, MAX_CHARS, MAX_ITEMS
from aner_lang.host import files
from aner_lang.interp.context import ExecContext
from aner_lang.interp.values import Value, show, to_plain
from aner_lang.problems.errors import AnerRuntimeError, OutputClosed

Number = TypeVar("Number", int, float)
"""Int or Float: `min`, `max` and `abs` have one overload for each, of the same type throughout."""
R = TypeVar("R")


def print_(ctx: ExecContext, value: Value) -> None:
    """A closed output (its reader went away) stops the run quietly (`OutputClosed`)."""
    try:
        print(show(value), file=ctx.stdout)
    except BrokenPipeError:
        raise OutputClosed from None


def len_(items: list[Value] | None = None, text: str | None = None) -> int:
    """`len(items)` or `len(text)`: the overload called passes exactly one of them."""
    return len(items) if items is not None else len(text or "")


def range_(stop: int, start: int | None = None, step: int = 1) -> list[int]:
    r = range(stop) if start is None else range(start, stop, step)
    check_size(len(r), MAX_ITEMS, "items", "`range`")
    return list(r)


def str_(value: Value) -> str:
    return show(value)


def _to_int(fn: Callable[[float], int], x: float) -> int:
    """`fn(x)` (a float rounded one way or another to an integer), which must be an Int."""
    if not math.isfinite(x):
        raise AnerRuntimeError(
            f"{fn.__name__}({show(x)}): {show(x)} has no integer value", code="E-VALUE"
        )
    result = fn(x)
    if not INT_MIN <= result <= INT_MAX:
        raise overflow(f"{fn.__name__}({show(x)})")
    return result


def int_(x: float) -> int:
    return _to_int(int, x)


def float_(x: int) -> float:
    return float(x)


def join(items: list[str], sep: str) -> str:
    size = sum(map(len, items)) + len(sep) * max(len(items) - 1, 0)
    check_size(size, MAX_CHARS, "characters", "`join`")
    return sep.join(items)


def split(text: str, sep: str | None) -> list[str]:
    return text.split(sep)


def min_(a: Number, b: Number) -> Number:
    return min(a, b)


def max_(a: Number, b: Number) -> Number:
    return max(a, b)


def abs_(x: Number) -> Number:
    return negate(x) if x < 0 else x


def _math(fn: Callable[..., float], *args: float) -> float:
    """`fn(*args)` of `math`: a domain error is `E-VALUE`, a result too large for a Float is
    `E-OVERFLOW` (never an infinity)."""
    call = f"{fn.__name__}({', '.join(show(a) for a in args)})"
    try:
        return fn(*args)
    except OverflowError:
        raise overflow(call) from None
    except ValueError as e:
        raise AnerRuntimeError(f"{call}: {e}", code="E-VALUE") from None


def sqrt(x: float) -> float:
    return _math(math.sqrt, x)


def exp(x: float) -> float:
    return _math(math.exp, x)


def log(x: float) -> float:
    return _math(math.log, x)


def floor(x: float) -> int:
    return _to_int(math.floor, x)


def ceil(x: float) -> int:
    return _to_int(math.ceil, x)


def round(x: float) -> int:
    return _to_int(builtins.round, x)


def pow_(base: float, exponent: float) -> float:
    return _math(math.pow, base, exponent)


def read_text(ctx: ExecContext, path: str) -> str:
    return files.read_text(ctx.resolve_path(path), files.TEXT_LIMIT)


def write_json(ctx: ExecContext, path: str, value: Value, overwrite: bool = False) -> None:
    """JSON proper: NaN and the infinities, which JSON has no words for, are an error naming
    where in the value they are, not a file other tools refuse. Only rank 0 of a distributed run
    writes (`ExecContext.writes_files`); every rank checks the value."""
    full = ctx.resolve_path(path)
    plain = to_plain(value)
    bad = _non_finite(plain, "the value")
    if bad is not None:
        raise AnerRuntimeError(
            f"write_json: {bad[0]} is {show(bad[1])}, which JSON cannot hold",
            code="E-VALUE",
            notes=("JSON numbers are finite: NaN and the infinities have no JSON form",),
        )
    text = json.dumps(plain, indent=2, default=str, allow_nan=False) + "\n"
    if ctx.writes_files:
        files.write_file(full, text.encode("utf-8"), overwrite=overwrite)


def _non_finite(value: object, where: str) -> tuple[str, float] | None:
    """The first NaN or infinity inside a plain value: (where it is, the number)."""
    if isinstance(value, float) and not math.isfinite(value):
        return where, value
    items = (
        value.items()
        if isinstance(value, dict)
        else enumerate(value)
        if isinstance(value, list)
        else ()
    )
    for key, item in items:
        found = _non_finite(
            item, f"{where}[{key!r}]" if isinstance(key, str) else f"{where}[{key}]"
        )
        if found is not None:
            return found
    return None

"""Run-time values that have no plain Python equivalent, and their text form.

An Aner value at run time is one of: `None` (none), `bool`, `int` (Int and Bytes), `float`, `str`,
a `list` of values, an `EnumValue`, a `RecordValue`, or an opaque object a native builtin returned
(a model, an adapter, a run). The checker has fixed every expression's type before the run, so the
evaluator holds values as `Value` (that is, `object`) and narrows only where an operation needs a
particular form.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TypeAlias

Value: TypeAlias = object
"""Any run-time value (see the module docstring for its forms)."""


@dataclass(frozen=True, slots=True)
class EnumValue:
    """A member of a builtin or user enum (crosses into builtins as its member name)."""

    enum: str
    member: str

    def __str__(self) -> str:
        return self.member


@dataclass(frozen=True, slots=True)
class RecordValue:
    """An instance of a user `record` type; `fields` in declaration order."""

    type_name: str
    fields: tuple[tuple[str, Value], ...]

    def get(self, name: str) -> Value:
        for key, value in self.fields:
            if key == name:
                return value
        raise KeyError(name)

    def __str__(self) -> str:
        inner = ", ".join(f"{k}: {show(v, quote=True)}" for k, v in self.fields)
        return f"{self.type_name}({inner})"


def show(value: Value, quote: bool = False) -> str:
    """How `print` and `str` and interpolation show a value."""
    if value is None:
        return "none"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return f'"{value}"' if quote else value
    if isinstance(value, float):
        return repr(value)
    if isinstance(value, list):
        return "[" + ", ".join(show(v, quote=True) for v in value) + "]"
    return str(value)


def to_plain(value: Value) -> Value:
    """An Aner value as plain JSON-able Python (records -> dicts, enums -> member names)."""
    if isinstance(value, EnumValue):
        return value.member
    if isinstance(value, RecordValue):
        return {k: to_plain(v) for k, v in value.fields}
    if isinstance(value, list):
        return [to_plain(v) for v in value]
    return value

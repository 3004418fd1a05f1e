"""Run-time values that have no plain Python equivalent, and their text form.

An Aner value at run time is one of: `None` (none), `bool`, `int` (Int and Bytes), `float`, `str`,
a `list` of values, an `EnumValue`, a `RecordValue`, or an opaque object a native builtin returned
(a model, an adapter, a run). The checker has fixed every expression's type before the run, so the
evaluator holds values as `Value` (that is, `object`) and narrows only where an operation needs a
particular form.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, fields
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
        return record_fields(self.type_name, self.fields)


def record_text(value: object) -> str:
    """A record-like value a native builtin returned (a dataclass: `ModelInfo`, `Evaluation`,
    `Split`) in the text form of a user record, `Name(field: value, ...)` with each value as Aner
    shows it, never Python's repr (`name='x'`): such classes define `__str__` with this."""
    pairs = [(f.name, getattr(value, f.name)) for f in fields(value)]  # type: ignore[arg-type]
    return record_fields(type(value).__name__, pairs)


def record_fields(type_name: str, pairs: Iterable[tuple[str, Value]]) -> str:
    """`type_name(name: value, ...)`: the text form of a record, each value as Aner shows it."""
    inner = ", ".join(f"{k}: {show(v, quote=True)}" for k, v in pairs)
    return f"{type_name}({inner})"


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

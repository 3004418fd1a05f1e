"""Run-time values that have no plain Python equivalent, and their text form."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class EnumValue:
    """A member of a builtin or user enum (crosses into builtins as its member name)."""

    enum: str
    member: str

    def __str__(self) -> str:
        return self.member


@dataclass(frozen=True)
class RecordValue:
    """An instance of a user `record` type."""

    type_name: str
    fields: tuple[tuple[str, Any], ...]

    def get(self, name: str) -> Any:
        return dict(self.fields)[name]

    def __str__(self) -> str:
        inner = ", ".join(f"{k}: {show(v, quote=True)}" for k, v in self.fields)
        return f"{self.type_name}({inner})"


def show(value: Any, quote: bool = False) -> str:
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


def to_plain(value: Any) -> Any:
    """An Aner value as plain JSON-able Python (records -> dicts, enums -> member names)."""
    if isinstance(value, EnumValue):
        return value.member
    if isinstance(value, RecordValue):
        return {k: to_plain(v) for k, v in value.fields}
    if isinstance(value, list):
        return [to_plain(v) for v in value]
    return value

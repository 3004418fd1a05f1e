"""The Aner type algebra: primitive, list, optional, enum and named (record / opaque) types,
assignability with Int -> Float promotion, and the parser for the type strings of the registry."""

from __future__ import annotations

import re
from collections.abc import Container, Mapping
from dataclasses import dataclass
from functools import cache


@dataclass(frozen=True, slots=True)
class Prim:
    name: str  # Int Float Bool String Bytes None Any Never

    def __str__(self) -> str:
        return self.name


@dataclass(frozen=True, slots=True)
class ListT:
    elem: Type

    def __str__(self) -> str:
        return f"List[{self.elem}]"


@dataclass(frozen=True, slots=True)
class OptionalT:
    inner: Type

    def __str__(self) -> str:
        return f"{self.inner}?"


@dataclass(frozen=True, slots=True)
class EnumT:
    name: str
    members: tuple[str, ...]

    def __str__(self) -> str:
        return self.name


@dataclass(frozen=True, slots=True)
class NamedT:
    """A user record or a builtin opaque type; its fields are looked up by name."""

    name: str

    def __str__(self) -> str:
        return self.name


Type = Prim | ListT | OptionalT | EnumT | NamedT

INT, FLOAT, BOOL, STRING, BYTES = (
    Prim("Int"),
    Prim("Float"),
    Prim("Bool"),
    Prim("String"),
    Prim("Bytes"),
)
NONE, ANY, NEVER = Prim("None"), Prim("Any"), Prim("Never")
PRIMITIVES = {t.name: t for t in (INT, FLOAT, BOOL, STRING, BYTES, NONE, ANY)}
NUMERIC = (INT, FLOAT)


def optional(t: Type) -> Type:
    return t if isinstance(t, OptionalT) or t in (NONE, ANY) else OptionalT(t)


def assign_cost(src: Type, dst: Type) -> int | None:
    """How a value of type `src` fits where `dst` is expected: 0 exactly, 1 with a promotion
    (Int -> Float, T -> T?), None when it does not fit."""
    if src == dst or dst == ANY or src in (ANY, NEVER):
        return 0
    if src == INT and dst == FLOAT:
        return 1
    if isinstance(dst, OptionalT):
        if src == NONE:
            return 0
        inner = src.inner if isinstance(src, OptionalT) else src
        cost = assign_cost(inner, dst.inner)
        return None if cost is None else cost + (0 if isinstance(src, OptionalT) else 1)
    if isinstance(src, ListT) and isinstance(dst, ListT):
        return assign_cost(src.elem, dst.elem)
    return None


def join(a: Type, b: Type) -> Type | None:
    """The type of a list holding both `a` and `b` values (None if they do not mix)."""
    if assign_cost(a, b) is not None:
        return b
    if assign_cost(b, a) is not None:
        return a
    if a == NONE:
        return optional(b)
    if b == NONE:
        return optional(a)
    return None


_TOKEN = re.compile(r"\s*([A-Za-z_][A-Za-z0-9_]*|\[|\]|,|\?)")

ParsedType = tuple[str, tuple["ParsedType", ...], int]
"""A registry type string taken apart: (name, type arguments, how many `?` follow)."""


@cache
def parse_type_string(text: str) -> ParsedType:
    """Parse a registry type string (``"List[Target]"``, ``"Dataset?"``) into a nested tuple
    ``(name, args, optional_depth)``; `registry_type` resolves it against the known type names."""
    tokens = _TOKEN.findall(text)
    pos = 0

    def parse() -> ParsedType:
        nonlocal pos
        name = tokens[pos]
        pos += 1
        args: list[ParsedType] = []
        if pos < len(tokens) and tokens[pos] == "[":
            pos += 1
            args.append(parse())
            while tokens[pos] == ",":
                pos += 1
                args.append(parse())
            pos += 1  # ]
        opt = 0
        while pos < len(tokens) and tokens[pos] == "?":
            opt += 1
            pos += 1
        return (name, tuple(args), opt)

    result = parse()
    if pos != len(tokens) or "".join(tokens) != re.sub(r"\s", "", text):
        raise ValueError(f"bad registry type string {text!r}")
    return result


def registry_type(text: str, enums: Mapping[str, EnumT], named: Container[str]) -> Type:
    """The type a registry type string means: a primitive, `List[...]`, one of `enums`, or one of
    the `named` (record / opaque) types. Raises ValueError for anything else: registry text is
    written by Aner's engineers, so an unknown name there is a bug, not user input."""
    return _resolve(parse_type_string(text), text, enums, named)


def _resolve(
    parsed: ParsedType, text: str, enums: Mapping[str, EnumT], named: Container[str]
) -> Type:
    name, args, opt = parsed
    if name == "List" and len(args) == 1:
        ty: Type = ListT(_resolve(args[0], text, enums, named))
    elif args:
        raise ValueError(f"registry type {text!r}: only List takes type arguments")
    elif name in PRIMITIVES:
        ty = PRIMITIVES[name]
    elif name in enums:
        ty = enums[name]
    elif name in named:
        ty = NamedT(name)
    else:
        raise ValueError(f"registry type {text!r}: unknown type {name!r}")
    for _ in range(opt):
        ty = optional(ty)
    return ty

"""The defaults of builtin parameters, as the interpreter fills them in.

A registry default is an Aner expression in a string (`aner_lang.builtins.spec`). It is one of:

* a literal (number, string, byte size, bool, `none`, enum member, or a list of these): a
  `Constant`, computed once (an Int for a Float parameter becomes a Float, as an argument does);
* a call to a builtin whose arguments are literals (`profile()`): a `BuiltinCall`, which the
  interpreter makes each time a call needs the default, at that call, with the callee's own
  defaults filled in the same way. Each call so gets a fresh value (two `train` calls never share
  one profile object), and the callee's constraints and errors apply as to any call.

Defaults only ever reach an implementation, never the script, so they are held in the form an
implementation receives: enum members as their names. A default that is neither form is a bug in
the registry, reported as such when a call first needs it.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache
from typing import TypeAlias

from aner_lang.builtins import registry
from aner_lang.builtins.spec import Builtin, Param
from aner_lang.check.checker import registry_expr
from aner_lang.check.consteval import evaluate
from aner_lang.grammar import ast


@dataclass(frozen=True, slots=True)
class Constant:
    """A literal default; a list is copied on its way to an implementation (`to_native`)."""

    value: object


@dataclass(frozen=True, slots=True)
class BuiltinCall:
    """A default made by calling `builtin`, with a value for each of its parameters."""

    builtin: Builtin
    args: tuple[tuple[str, Default], ...]


Default: TypeAlias = Constant | BuiltinCall


@cache
def registry_default(param: Param) -> Default:
    """The default of the builtin parameter `param` (resolved once per process)."""
    text = param.default
    if text is None:
        raise AssertionError(f"`{param.name}` has no default")
    expr = registry_expr(text)
    if isinstance(expr, ast.Call):
        return _builtin_call(text, expr)
    return Constant(_literal(text, expr, param))


@cache
def _enum_members() -> frozenset[str]:
    return frozenset(m.name for e in registry().enums.values() for m in e.members)


def _literal(text: str, expr: ast.Expr, param: Param) -> object:
    """The literal `expr` for `param`; an Int for a Float parameter becomes a Float, as an
    argument would."""
    try:
        value = evaluate(expr, {}, _enum_members())
    except Exception as e:
        raise ValueError(f"registry default `{text}` is neither a literal nor a call") from e
    return float(value) if param.type == "Float" and type(value) is int else value


def _builtin_call(text: str, call: ast.Call) -> BuiltinCall:
    overloads = (
        registry().functions.get(call.callee.name, ()) if isinstance(call.callee, ast.Name) else ()
    )
    if len(overloads) != 1:
        raise ValueError(f"registry default `{text}` must call a builtin with one signature")
    b = overloads[0]
    by_name = {p.name: p for p in b.params}
    positional = [p.name for p in b.params if not p.keyword_only]
    written: dict[str, object] = {}
    for i, arg in enumerate(call.args):
        name = arg.name or (positional[i] if i < len(positional) else "")
        if name not in by_name:
            raise ValueError(f"registry default `{text}`: argument {i + 1} fits no parameter")
        written[name] = _literal(text, arg.value, by_name[name])
    args: list[tuple[str, Default]] = []
    for p in b.params:
        if p.name in written:
            args.append((p.name, Constant(written[p.name])))
        elif p.default is not None:
            args.append((p.name, registry_default(p)))
        else:
            raise ValueError(f"registry default `{text}` leaves `{p.name}` of `{b.name}` unset")
    return BuiltinCall(b, tuple(args))

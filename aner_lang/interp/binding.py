"""Where each parameter of a call gets its value: a call site's plan, made once from the checker's
`CallInfo` the first time the call runs.

`CallInfo.bound` pairs every parameter with the expression that fills it, the argument the caller
wrote or else the parameter's default. They are evaluated in different places:

* an argument, in the caller's scope;
* the default of a user `fn` parameter or `record` field, in the module that declares it (its
  names and enum members are that module's, also when another module calls it);
* a builtin's default, from the registry, as `defaults.py` describes.

Wherever it comes from, an Int for a Float parameter becomes a Float.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TypeAlias

from aner_lang.builtins.spec import Builtin
from aner_lang.check import Analysis, CallInfo
from aner_lang.check.types import FLOAT, Type
from aner_lang.grammar import ast
from aner_lang.interp.defaults import Default, registry_default
from aner_lang.interp.env import Module

Arg: TypeAlias = tuple[str, ast.Expr, bool]
"""(parameter, the argument written by the caller, promote an Int to Float)."""

UserArg: TypeAlias = tuple[str, ast.Expr, Module | None, bool]
"""(parameter, expression, the declaring module for a default or None for an argument, promote)."""


@dataclass(frozen=True, slots=True)
class BuiltinPlan:
    """A builtin call: the written arguments, then the registry defaults of the others."""

    builtin: Builtin
    args: tuple[Arg, ...]
    defaults: tuple[tuple[str, Default], ...]
    returns: Type | None
    """The call's type, which the result is read back as (None: no type was recorded)."""


@dataclass(frozen=True, slots=True)
class FnPlan:
    """A call of a user `fn`, whose body runs in `module`."""

    name: str
    fn: ast.FnDecl
    module: Module
    args: tuple[UserArg, ...]


@dataclass(frozen=True, slots=True)
class RecordPlan:
    """A record construction: `args` in field order."""

    name: str
    args: tuple[UserArg, ...]


CallPlan: TypeAlias = BuiltinPlan | FnPlan | RecordPlan


def plan_call(a: Analysis, e: ast.Call, declared: Mapping[int, Module]) -> CallPlan:
    """The plan of call `e` of the file `a`; `declared` maps id(FnDecl or RecordDecl) to the module
    that declares it (every module a file imports has run before its calls do)."""
    info = a.calls[id(e)]
    written = {id(arg.value) for arg in e.args}
    if info.receiver is not None:
        written.add(id(info.receiver))
    if info.kind == "builtin":
        entry = a.expr_types.get(id(e))
        return _builtin_plan(info, written, None if entry is None else entry[1])
    decl = None if info.definition is None else info.definition.node
    if not isinstance(decl, (ast.FnDecl, ast.RecordDecl)):
        raise AssertionError(f"`{info.name}` resolved to no declaration")
    module = declared[id(decl)]
    args: list[UserArg] = []
    for (name, expr), ty in zip(info.bound, info.param_types):
        if expr is None:
            raise AssertionError(f"`{name}` of `{info.name}` is unbound")
        args.append((name, expr, None if id(expr) in written else module, ty == FLOAT))
    if isinstance(decl, ast.FnDecl):
        return FnPlan(info.name, decl, module, tuple(args))
    return RecordPlan(info.name, tuple(args))


def _builtin_plan(info: CallInfo, written: set[int], returns: Type | None) -> BuiltinPlan:
    b = info.builtin
    if b is None:
        raise AssertionError(f"`{info.name}` resolved to no builtin")
    args: list[Arg] = []
    defaults: list[tuple[str, Default]] = []
    for p, (name, expr), ty in zip(b.params, info.bound, info.param_types):
        if expr is not None and id(expr) in written:
            args.append((name, expr, ty == FLOAT))
        elif p.default is not None:
            defaults.append((name, registry_default(p)))
        else:
            raise AssertionError(f"`{name}` of `{b.name}` is unbound")
    return BuiltinPlan(b, tuple(args), tuple(defaults), returns)

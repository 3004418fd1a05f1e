"""Checks of a script against its surroundings, before it runs: the files it reads and the machine.

`analyze` checks a script as text, the same anywhere (documentation, the editor). This pass asks
the machine: every builtin call with a `precheck` (`aner_lang.builtins.spec.Builtin`) is given the
arguments known statically (each argument or default that is a constant expression) and the
directory paths are relative to, and each failure it returns becomes a diagnostic at that
parameter's argument (at the call when the parameter was left to its default). Imported files are
checked too, each against its own directory. `aner check` and `aner run` run it after `analyze`.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import cast

from aner_lang.builtins import registry
from aner_lang.check.analysis import Analysis, CallInfo
from aner_lang.check.consteval import STATIC_FAILURES, evaluate
from aner_lang.diagnostics import Diagnostic
from aner_lang.errors import AnerRuntimeError

Precheck = Callable[[Mapping[str, object], Path], list[tuple[str, AnerRuntimeError]]]


def environment_diagnostics(analysis: Analysis) -> list[Diagnostic]:
    """The prechecks' failures in `analysis` and the files it imports."""
    found: list[Diagnostic] = []
    seen: set[int] = set()
    pending = [analysis]
    while pending:
        a = pending.pop()
        if id(a) in seen:
            continue
        seen.add(id(a))
        pending += list(a.imports.values())
        base = Path(a.path).resolve().parent if a.path else Path.cwd()
        for info in a.calls.values():
            found += [d.at(a.path) for d in _call(info, base)]
    return found


def written_arguments(info: CallInfo) -> set[int]:
    """The ids of the argument expressions the call writes (not its parameters' defaults)."""
    written = {id(a.value) for a in info.call.args}
    if info.receiver is not None:
        written.add(id(info.receiver))
    return written


def static_arguments(info: CallInfo) -> dict[str, object]:
    """The call's arguments and defaults that are constant expressions, by parameter name (enum
    members as their names); the others are left out."""
    members = frozenset(m.name for e in registry().enums.values() for m in e.members)
    args: dict[str, object] = {}
    for name, expr in info.bound:
        if expr is None:
            continue
        try:
            args[name] = evaluate(expr, {}, members)
        except STATIC_FAILURES:
            continue
    return args


def _call(info: CallInfo, base: Path) -> list[Diagnostic]:
    b = info.builtin
    if info.kind != "builtin" or b is None or not b.precheck:
        return []
    written = written_arguments(info)
    args = static_arguments(info)
    where = {
        name: expr.span for name, expr in info.bound if expr is not None and id(expr) in written
    }
    module, _, function = b.precheck.partition(":")
    check = cast(Precheck, getattr(importlib.import_module(module), function))
    return [
        Diagnostic(e.code, where.get(param, info.call.span), e.message, notes=e.notes)
        for param, e in check(args, base)
    ]

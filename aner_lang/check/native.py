"""Whether this installation can run a script's native builtins, decided before it runs.

A script whose calls resolve to native builtins (`load_model`, `train`, ...) needs the packages
each declares (`Builtin.requires`). Where one is not installed, the first such call gets one
diagnostic naming the package, with the number of other calls that need it: an error when the
script is about to run (nothing runs, so a script that first talks to a service does not fail
halfway), a warning for `aner check`. Packages are looked up with `importlib.util.find_spec`,
never imported, so checking stays fast and torch-free. Scripts that only use services, jobs and
the core builtins need none of them.
"""

from __future__ import annotations

import importlib.util
from functools import cache

from aner_lang.builtins.spec import Builtin
from aner_lang.check.analysis import Analysis
from aner_lang.grammar.ast import Span
from aner_lang.problems import diagnostics as msg
from aner_lang.problems.diagnostics import Diagnostic


@cache
def installed(package: str) -> bool:
    try:
        return importlib.util.find_spec(package) is not None
    except (ImportError, ValueError):  # a parent package that fails to import, or a stub module
        return False


def _missing(b: Builtin) -> str | None:
    return next((p for p in b.requires if not installed(p)), None) if b.native else None


def _native_calls(a: Analysis) -> list[tuple[Span, str | None, Builtin, str]]:
    """(span, file, builtin, missing package) of every call whose package is missing, the
    script's own in source order, then its imports'."""
    found = [
        (info.call.span, a.path, info.builtin, missing)
        for info in sorted(a.calls.values(), key=lambda c: c.call.span.start)
        if info.builtin is not None and (missing := _missing(info.builtin)) is not None
    ]
    for sub in a.imports.values():
        found += _native_calls(sub)
    return found


def native_unavailable(a: Analysis, *, before_running: bool) -> list[Diagnostic]:
    """One diagnostic for the first native call this installation cannot run (none if all can)."""
    calls = _native_calls(a)
    if not calls:
        return []
    span, path, b, package = calls[0]
    d = msg.native_unavailable(span, b.name, package, len(calls) - 1, before_running)
    return [d.at(path)]

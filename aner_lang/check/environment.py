"""Checks of a script against its surroundings, before it runs: the files it reads and writes, and
the machine.

`analyze` checks a script as text, the same anywhere (documentation, the editor). This pass asks
the machine, under one rule: a check before a run never refuses a script that would run, so it
refuses only what fails on every path through the script; everything else is checked by the
call itself when it runs, with the same code, at its source position.

* A builtin call with a `precheck` (`aner_lang.builtins.spec.Builtin`) is checked only when it
  certainly runs (`reach`: unconditional code of the script or of a file it imports), given the
  arguments known statically (each argument or default that is a constant expression) and the
  directory paths are relative to. A path the call reads (`Param.path`) that the script may
  write before the call runs is left out, as if computed at run time: a write whose target is
  that path, a folder around it or inside it, or not known before the run, in a function (which
  may be called first), in another file, or earlier in the same file.
* A path a call writes that is known statically is checked as the call will check it
  (`prechecks.output`: an existing file or a non-empty folder without `overwrite: true`, a file
  where a folder goes): an error where the call certainly runs, so no training is lost to it,
  and a warning (`W-WRITE-TARGET`) where it may run.

Each failure becomes a diagnostic at that parameter's argument (at the call when the parameter
was left to its default). `check_before_run` (`aner_lang.check.before_run`) runs this pass after
`analyze`.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import cast

from aner_lang.builtins import registry
from aner_lang.builtins.spec import WRITES, Builtin
from aner_lang.check.analysis import Analysis, CallInfo
from aner_lang.check.consteval import STATIC_FAILURES, evaluate
from aner_lang.check.reach import Reach, reach
from aner_lang.grammar.ast import Span
from aner_lang.host import files, prechecks
from aner_lang.problems.diagnostics import WARNING, Diagnostic
from aner_lang.problems.errors import AnerRuntimeError

Precheck = Callable[[Mapping[str, object], Path], list[tuple[str, AnerRuntimeError]]]


@dataclass(frozen=True)
class Write:
    """A path a call may write: `target` resolved (None when not known before the run), where
    the call is (file, offset), and whether it is outside any declaration (`Reach.top_level`)."""

    target: Path | None
    file: str | None
    start: int
    top_level: bool

    def may_come_before(self, path: Path, file: str | None, start: int) -> bool:
        """Whether this write may run before a call at `file`:`start` and touch `path` (the same
        path, or a folder around it, or a path inside it)."""
        if self.top_level and self.file == file and self.start >= start:
            return False
        if self.target is None:
            return True
        here = path.resolve()
        return here == self.target or self.target in here.parents or here in self.target.parents


def environment_diagnostics(analysis: Analysis) -> list[Diagnostic]:
    """The failures the files and the machine make certain in `analysis` and the files it
    imports (see the module docstring)."""
    program = _files(analysis)
    reaches = {id(a): reach(a.module) for a in program}
    writes = [w for a in program for w in _writes(a, reaches[id(a)])]
    found: list[Diagnostic] = []
    for a in program:
        base = _base(a)
        certain = reaches[id(a)].unconditional
        for info in a.calls.values():
            if info.kind == "builtin" and info.builtin is not None:
                runs = id(info.call) in certain
                found += [d.at(a.path) for d in _call(info, info.builtin, a, base, runs, writes)]
    return found


def program_writes(analysis: Analysis) -> list[Write]:
    """Every path the script of `analysis` and the files it imports may write (whether one comes
    before a call: `Write.may_come_before`)."""
    return [w for a in _files(analysis) for w in _writes(a, reach(a.module))]


def _files(analysis: Analysis) -> list[Analysis]:
    """The script's analysis and those of the files it imports, each once."""
    out: list[Analysis] = []
    pending = [analysis]
    while pending:
        a = pending.pop()
        if any(a is b for b in out):
            continue
        out.append(a)
        pending += list(a.imports.values())
    return out


def _base(a: Analysis) -> Path:
    """The folder a file's relative paths start from."""
    return Path(a.path).resolve().parent if a.path else Path.cwd()


def _writes(a: Analysis, r: Reach) -> list[Write]:
    """Every path a builtin call of `a` may write (none for a write argument that is `none`)."""
    found = []
    for info in a.calls.values():
        b = info.builtin
        if info.kind != "builtin" or b is None:
            continue
        args = static_arguments(info)
        for p in b.params:
            if p.path not in WRITES or (p.name in args and not isinstance(args[p.name], str)):
                continue
            value = args.get(p.name)
            target = files.resolve(value, _base(a)).resolve() if isinstance(value, str) else None
            start = info.call.span.start
            found.append(Write(target, a.path, start, id(info.call) in r.top_level))
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


def _call(
    info: CallInfo, b: Builtin, a: Analysis, base: Path, runs: bool, writes: list[Write]
) -> list[Diagnostic]:
    """The diagnostics of one builtin call: its write targets, then (when it certainly runs) its
    precheck."""
    written = written_arguments(info)
    where = {
        name: expr.span for name, expr in info.bound if expr is not None and id(expr) in written
    }
    args = static_arguments(info)
    found = []
    for p in b.params:
        value = args.get(p.name)
        if p.path in WRITES and isinstance(value, str):
            folder = p.path == "writes_folder"
            target = files.resolve(value, base)
            e = prechecks.output(target, folder=folder, overwrite=args.get("overwrite"))
            if e is not None:
                found.append(_target_failure(where.get(p.name, info.call.span), e, runs))
    if not runs or not b.precheck:
        return found
    start = info.call.span.start
    for p in b.params:
        value = args.get(p.name)
        if p.path == "reads" and isinstance(value, str):
            path = files.resolve(value, base)
            if any(w.may_come_before(path, a.path, start) for w in writes):
                del args[p.name]
    module, _, function = b.precheck.partition(":")
    check = cast(Precheck, getattr(importlib.import_module(module), function))
    return found + [
        Diagnostic(e.code, where.get(param, info.call.span), e.message, notes=e.notes)
        for param, e in check(args, base)
    ]


def _target_failure(span: Span, e: AnerRuntimeError, runs: bool) -> Diagnostic:
    """A write target's failure: the call's own error where it certainly runs, else a warning."""
    if runs:
        return Diagnostic(e.code, span, e.message, notes=e.notes)
    return Diagnostic(
        "W-WRITE-TARGET",
        span,
        f"{e.message}: this call fails with {e.code} if it runs",
        severity=WARNING,
        notes=e.notes,
    )

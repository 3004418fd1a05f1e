"""Run-time failures as diagnostics, with the Aner call stack.

An `AnerRuntimeError` from a builtin keeps its code and notes (a missing native package is one:
`NativeBackendUnavailable`); a `RecursionError` is `E-RECURSION`, a `MemoryError` `E-MEMORY`; any
other Python exception is a bug in Aner and is reported as an internal error. Every one is located
at an Aner span and carries the Aner frames as notes, so no Python traceback reaches a user.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TypeAlias

from aner_lang.grammar.ast import Span
from aner_lang.problems import diagnostics as msg
from aner_lang.problems.diagnostics import Diagnostic
from aner_lang.problems.errors import AnerRuntimeError

_SHOWN_FRAMES = 12
"""A deeper stack shows its innermost and outermost calls only."""


class AnerError(Exception):
    """A run-time failure as a diagnostic (raised out of `run`)."""

    def __init__(self, diagnostic: Diagnostic) -> None:
        super().__init__(diagnostic.message)
        self.diagnostic = diagnostic


Frame: TypeAlias = tuple[str, Span, str | None]
"""One active call: (the function or builtin called, the call's span, the caller's file)."""


def failure(
    path: str | None, span: Span | None, exc: BaseException, stack: Sequence[Frame]
) -> AnerError:
    """`exc`, raised at `span` of the file at `path` while `stack` was active, as an AnerError."""
    if isinstance(exc, AnerRuntimeError):
        d = msg.runtime_error(span, exc.message, exc.code, exc.notes)
    elif isinstance(exc, RecursionError):
        d = msg.runtime_error(span, "too deep recursion", "E-RECURSION", ())
    elif isinstance(exc, MemoryError):
        d = msg.out_of_memory(span)
    else:
        d = msg.internal_error(span, exc)
    frames = [
        f"called from `{name}` at {where or '<input>'}:{s.line}:{s.col}"
        for name, s, where in reversed(stack)
    ]
    if len(frames) > _SHOWN_FRAMES:
        hidden = len(frames) - _SHOWN_FRAMES + 1
        frames = frames[: _SHOWN_FRAMES - 3] + [f"... {hidden} more calls ..."] + frames[-2:]
    return AnerError(
        Diagnostic(d.code, d.span, d.message, notes=d.notes + tuple(frames), path=path)
    )

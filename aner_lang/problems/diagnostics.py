"""Diagnostics: the one module of Aner's user-facing messages and error codes, and their renderer.

A `Diagnostic` is data (code, severity, span, message, notes, suggestion, path). The parser, the
checker and the interpreter create them only through the constructor functions below, so every
message and code lives here; the CLI renders them as `file:line:col` plus a caret excerpt, and the
LSP converts the same objects to LSP diagnostics.

Codes are stable strings: ``E-SYNTAX``, ``E-UNKNOWN-NAME``, ... (errors) and ``W-UNUSED``
(warnings). Tests and golden files refer to them. Each is registered, with its explanation, in
`aner_lang.problems.error_codes` (`aner explain CODE`).
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from functools import lru_cache
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # a runtime import would be circular: the parser creates diagnostics
    from aner_lang.grammar.ast import Span
    from aner_lang.problems.errors import AnerRuntimeError

ERROR = "error"
WARNING = "warning"


@dataclass(frozen=True)
class Diagnostic:
    code: str
    span: Span | None
    message: str
    severity: str = ERROR
    notes: tuple[str, ...] = ()
    suggestion: str | None = None
    """A replacement for the text under `span` that fixes the problem (for quick fixes)."""
    path: str | None = None
    related: tuple[tuple[str, Span | None, str | None], ...] = field(default=())
    """(message, span, path) of related locations, e.g. where a name was defined."""

    @property
    def is_error(self) -> bool:
        return self.severity == ERROR

    def at(self, path: str | None) -> Diagnostic:
        """This diagnostic attributed to `path` (if it has none yet)."""
        return self if self.path is not None else replace(self, path=path)


def did_you_mean(name: str, candidates: Iterable[str]) -> str | None:
    """The closest candidate to a misspelt `name`, if any is close enough."""
    close = difflib.get_close_matches(name, list(candidates), n=1, cutoff=0.6)
    return close[0] if close else None


def _hint(name: str, candidates: Iterable[str]) -> tuple[tuple[str, ...], str | None]:
    best = did_you_mean(name, candidates)
    return ((f"did you mean `{best}`?",), best) if best else ((), None)


# ---- syntax --------------------------------------------------------------------------------------


def syntax_unexpected(span: Span, found: str, expected: list[str]) -> Diagnostic:
    notes = (f"expected one of: {', '.join(sorted(expected))}",) if expected else ()
    return Diagnostic("E-SYNTAX", span, f"syntax error: unexpected {found}", notes=notes)


def syntax_bad_char(span: Span, char: str) -> Diagnostic:
    return Diagnostic("E-SYNTAX", span, f"syntax error: unexpected character {char!r}")


def syntax_open_string(span: Span) -> Diagnostic:
    return Diagnostic(
        "E-SYNTAX",
        span,
        'syntax error: this string has no closing `"` on its line',
        notes=(
            "a string and its `${...}` interpolations end on the line they start on; "
            'write `\\"` for a quote and `\\$` for a dollar sign inside the text',
        ),
    )


def bad_literal(span: Span, what: str) -> Diagnostic:
    return Diagnostic("E-LITERAL", span, f"invalid literal: {what}")


def too_deep(span: Span, limit: int) -> Diagnostic:
    return Diagnostic(
        "E-NESTING",
        span,
        f"nesting deeper than {limit} levels, the limit",
        notes=("split the expression into `let` bindings or the code into functions",),
    )


# ---- names and types -----------------------------------------------------------------------------


def unknown_name(span: Span, name: str, candidates: Iterable[str]) -> Diagnostic:
    notes, best = _hint(name, candidates)
    return Diagnostic(
        "E-UNKNOWN-NAME", span, f"unknown name `{name}`", notes=notes, suggestion=best
    )


def unknown_type(span: Span, name: str, candidates: Iterable[str]) -> Diagnostic:
    notes, best = _hint(name, candidates)
    return Diagnostic(
        "E-UNKNOWN-TYPE", span, f"unknown type `{name}`", notes=notes, suggestion=best
    )


def bad_type_args(span: Span, name: str, expected: int, got: int) -> Diagnostic:
    return Diagnostic(
        "E-TYPE-ARGS", span, f"type `{name}` takes {expected} type argument(s), got {got}"
    )


def unknown_field(span: Span, type_name: str, name: str, candidates: Iterable[str]) -> Diagnostic:
    notes, best = _hint(name, candidates)
    return Diagnostic(
        "E-UNKNOWN-FIELD",
        span,
        f"`{type_name}` has no field `{name}`",
        notes=notes,
        suggestion=best,
    )


def unknown_member(span: Span, enum: str, name: str, candidates: Iterable[str]) -> Diagnostic:
    notes, best = _hint(name, candidates)
    members = ", ".join(candidates)
    return Diagnostic(
        "E-UNKNOWN-MEMBER",
        span,
        f"`{name}` is not a member of enum `{enum}`",
        notes=notes + (f"members: {members}",),
        suggestion=best,
    )


def type_mismatch(span: Span, expected: str, found: str, what: str = "value") -> Diagnostic:
    return Diagnostic(
        "E-TYPE", span, f"type mismatch: {what} should be `{expected}`, found `{found}`"
    )


def bad_operands(span: Span, op: str, left: str, right: str | None = None) -> Diagnostic:
    if right is None:
        return Diagnostic("E-OPERATOR", span, f"operator `{op}` cannot be applied to `{left}`")
    return Diagnostic(
        "E-OPERATOR", span, f"operator `{op}` cannot be applied to `{left}` and `{right}`"
    )


def not_callable(span: Span, what: str) -> Diagnostic:
    return Diagnostic("E-NOT-CALLABLE", span, f"{what} is not a function")


def not_indexable(span: Span, type_name: str) -> Diagnostic:
    return Diagnostic("E-INDEX", span, f"values of type `{type_name}` cannot be indexed")


def duplicate_definition(span: Span, name: str, previous: Span | None) -> Diagnostic:
    related = (("first defined here", previous, None),) if previous else ()
    return Diagnostic(
        "E-DUPLICATE", span, f"`{name}` is already defined in this scope", related=related
    )


def assign_to_non_variable(span: Span, name: str, kind: str) -> Diagnostic:
    return Diagnostic(
        "E-ASSIGN", span, f"cannot assign to `{name}`: it is a {kind}, not a `let` binding"
    )


def unused_binding(span: Span, name: str) -> Diagnostic:
    return Diagnostic(
        "W-UNUSED",
        span,
        f"`{name}` is never used",
        severity=WARNING,
        notes=("prefix the name with `_` to silence this warning",),
    )


def need_annotation(span: Span, name: str) -> Diagnostic:
    return Diagnostic(
        "E-ANNOTATION",
        span,
        f"cannot infer the type of `{name}` from an empty list or `none`",
        notes=("write the type: `let name: List[Int] = []`",),
    )


# ---- calls ---------------------------------------------------------------------------------------


def too_many_args(span: Span, fn: str, max_positional: int) -> Diagnostic:
    return Diagnostic(
        "E-ARGS",
        span,
        f"too many positional arguments for `{fn}` (it takes at most {max_positional})",
    )


def unknown_argument(span: Span, fn: str, name: str, candidates: Iterable[str]) -> Diagnostic:
    notes, best = _hint(name, candidates)
    return Diagnostic(
        "E-UNKNOWN-ARG",
        span,
        f"`{fn}` has no parameter named `{name}`",
        notes=notes,
        suggestion=best,
    )


def duplicate_argument(span: Span, fn: str, name: str) -> Diagnostic:
    return Diagnostic(
        "E-DUPLICATE-ARG", span, f"`{fn}` got more than one value for parameter `{name}`"
    )


def missing_argument(span: Span, fn: str, names: list[str]) -> Diagnostic:
    listed = ", ".join(f"`{n}`" for n in names)
    return Diagnostic("E-MISSING-ARG", span, f"missing required argument(s) {listed} for `{fn}`")


def argument_type(span: Span, fn: str, param: str, expected: str, found: str) -> Diagnostic:
    return Diagnostic(
        "E-ARG-TYPE", span, f"argument `{param}` of `{fn}` should be `{expected}`, found `{found}`"
    )


def no_matching_overload(
    span: Span, fn: str, found: list[str], candidates: list[str]
) -> Diagnostic:
    return Diagnostic(
        "E-OVERLOAD",
        span,
        f"no overload of `{fn}` accepts arguments ({', '.join(found)})",
        notes=tuple(["candidates:"] + [f"  {c}" for c in candidates]),
    )


def ambiguous_overload(span: Span, fn: str, candidates: list[str]) -> Diagnostic:
    return Diagnostic(
        "E-OVERLOAD",
        span,
        f"call to `{fn}` is ambiguous",
        notes=tuple(["candidates:"] + [f"  {c}" for c in candidates]),
    )


def constraint_failed(span: Span, fn: str, message: str, expr: str) -> Diagnostic:
    return Diagnostic("E-CONSTRAINT", span, f"`{fn}`: {message}", notes=(f"constraint: {expr}",))


# ---- statements ----------------------------------------------------------------------------------


def return_outside_fn(span: Span) -> Diagnostic:
    return Diagnostic("E-RETURN", span, "`return` outside of a function")


def missing_return(span: Span, fn: str, type_name: str) -> Diagnostic:
    return Diagnostic(
        "E-RETURN", span, f"function `{fn}` must return a `{type_name}` on every path"
    )


def declaration_not_top_level(span: Span, what: str) -> Diagnostic:
    return Diagnostic(
        "E-NESTED-DECL", span, f"{what} declarations are only allowed at the top level of a file"
    )


def import_not_found(span: Span, path: str, reason: str) -> Diagnostic:
    return Diagnostic("E-IMPORT", span, f'cannot import "{path}": {reason}')


def import_cycle(span: Span, chain: list[str]) -> Diagnostic:
    return Diagnostic("E-IMPORT-CYCLE", span, "import cycle: " + " -> ".join(chain))


# ---- run time ------------------------------------------------------------------------------------


def runtime_error(span: Span | None, message: str, code: str, notes: tuple[str, ...]) -> Diagnostic:
    return Diagnostic(code, span, message, notes=notes)


def assertion_failed(span: Span, message: str | None) -> Diagnostic:
    return Diagnostic("E-ASSERT", span, "assertion failed" + (f": {message}" if message else ""))


def out_of_memory(span: Span | None) -> Diagnostic:
    return Diagnostic(
        "E-MEMORY",
        span,
        "out of memory",
        notes=("the machine (or the process's memory limit) had no memory left for this",),
    )


def internal_error(span: Span | None, exc: BaseException) -> Diagnostic:
    return Diagnostic(
        "E-INTERNAL",
        span,
        f"internal error: {type(exc).__name__}: {exc}",
        notes=("this is a bug in Aner; please report it with the script that caused it",),
    )


def native_unavailable(
    span: Span, builtin: str, package: str, more_calls: int, before_running: bool
) -> Diagnostic:
    """A script calls native builtins on an installation without the native runtime: an error
    before `aner run` starts (nothing would run), a warning for `aner check` (the script is fine;
    this machine cannot run it)."""
    more = f"{more_calls} more call(s) in this script need it too" if more_calls else None
    return Diagnostic(
        "E-NATIVE-UNAVAILABLE" if before_running else "W-NATIVE-UNAVAILABLE",
        span,
        f"native runtime not installed: `{builtin}` needs the Python package '{package}'",
        severity=ERROR if before_running else WARNING,
        notes=tuple(n for n in (more, "install it with: pip install 'aner[native]'") if n),
    )


# ---- documentation checking ----------------------------------------------------------------------


def doc_block_should_fail(span: Span) -> Diagnostic:
    return Diagnostic("E-DOC-NO-ERROR", span, "this ```aner error block checks without errors")


def file_error(path: str, err: AnerRuntimeError) -> Diagnostic:
    """A file that cannot be read (or written), as a diagnostic of that file."""
    return Diagnostic(
        err.code, None, err.message.removeprefix(f"{path}: "), notes=err.notes, path=path
    )


# ---- rendering -----------------------------------------------------------------------------------


def render(diag: Diagnostic, source: str | None = None) -> str:
    """`file:line:col: severity[code]: message`, then a caret excerpt of the source, notes and
    related locations, as the CLI prints it."""
    where = diag.path or "<input>"
    if diag.span is not None:
        where += f":{diag.span.line}:{diag.span.col}"
    lines = [f"{where}: {diag.severity}[{diag.code}]: {diag.message}"]
    if source is not None and diag.span is not None:
        lines += _excerpt(source, diag.span)
    lines += [f"  = note: {n}" for n in diag.notes]
    for message, span, path in diag.related:
        loc = (path or diag.path or "<input>") + (f":{span.line}:{span.col}" if span else "")
        lines.append(f"  = note: {message} at {loc}")
    return "\n".join(lines)


EXCERPT_WIDTH = 120
"""The most characters of a source line an excerpt shows: a longer line (a 5,000-digit literal, a
minified list) is clipped to a window around the span, each cut side marked by `CLIPPED`."""
EXCERPT_LEAD = 40
"""Characters kept before the span in a clipped line, when the line has them."""
CLIPPED = "…"


def _excerpt(source: str, span: Span) -> list[str]:
    starts = _line_starts(source)
    if not 1 <= span.line <= len(starts):
        return []
    start = starts[span.line - 1]
    end = starts[span.line] - 1 if span.line < len(starts) else len(source)
    text = source[start:end].removesuffix("\r")
    width = len(str(span.line))
    first = span.col - 1
    last = span.end_col - 1 if span.end_line == span.line else len(text)
    lo = 0
    if len(text) > EXCERPT_WIDTH:  # the span's start, EXCERPT_LEAD before it, and what fits
        lo = max(0, min(first - EXCERPT_LEAD, len(text) - EXCERPT_WIDTH))
    hi = min(len(text), lo + EXCERPT_WIDTH)
    before, after = CLIPPED if lo > 0 else "", CLIPPED if hi < len(text) else ""
    carets = "^" * max(1, min(last, hi) - first)
    pad = " " * (len(before) + first - lo)
    return [
        f" {span.line} | {before}{text[lo:hi]}{after}",
        f" {' ' * width} | {pad}{carets}",
    ]


@lru_cache(maxsize=4)
def _line_starts(source: str) -> tuple[int, ...]:
    """The offset of each line of `source` (lines end at `\\n` only, as the parser counts them),
    computed once per source: rendering every diagnostic of a file is then linear, not quadratic
    in its length."""
    return (0, *(m.end() for m in re.finditer("\n", source)))

"""Answering completion and signature help while the buffer is being re-analysed.

Analysing a 2,000-line file takes a large part of a second on this hardware, far over the 50 ms a
completion may take, so the server analyses edits in the background (debounced) and, meanwhile,
answers from the previous analysis seen through the edit: offsets of the live text are mapped
back to the analysed text (unchanged before the edit, shifted after it, the edit's start inside
it). Cursor context always comes from the live text."""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from aner_lang.check.analysis import Analysis, Definition
    from aner_lang.check.types import Type
    from aner_lang.grammar.ast import Span


class AnalysisView(Protocol):
    """What completion and signature help read from an analysis: an `Analysis` of the live text,
    or a `ShiftedAnalysis` of an older one."""

    @property
    def path(self) -> str | None: ...
    @property
    def source(self) -> str:
        """The analysed text (the offsets of definitions and nodes point into it)."""
        ...

    @property
    def imports(self) -> dict[int, Analysis]: ...
    @property
    def field_types(self) -> dict[str, dict[str, Type]]: ...
    def scope_at(self, offset: int) -> dict[str, Definition]: ...


def _common_prefix(a: str, b: str) -> int:
    """Length of the longest common prefix (binary search on slice compares, which run in C)."""
    lo, hi = 0, min(len(a), len(b))
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if a[:mid] == b[:mid]:
            lo = mid
        else:
            hi = mid - 1
    return lo


def _common_suffix(a: str, b: str, limit: int) -> int:
    lo, hi = 0, limit
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if a[len(a) - mid :] == b[len(b) - mid :]:
            lo = mid
        else:
            hi = mid - 1
    return lo


class Edit:
    """Where `new` text differs from `old`: one replaced stretch, `old[prefix:old_end]` by
    `new[prefix:new_end]` (the common prefix and suffix around it are unchanged)."""

    def __init__(self, old: str, new: str) -> None:
        self.prefix = _common_prefix(old, new)
        suffix = _common_suffix(old, new, min(len(old), len(new)) - self.prefix)
        self.old_end = len(old) - suffix
        self.new_end = len(new) - suffix
        self.delta = len(new) - len(old)

    def to_old(self, offset: int) -> int:
        """A `new` offset in `old`: after the edit (checked first: at a deletion's point the text
        after it is meant), before it, or inside it (its start)."""
        if offset >= self.new_end:
            return offset - self.delta
        return offset if offset <= self.prefix else self.prefix

    def span_to_new(self, span: Span) -> Span | None:
        """An `old` span in `new` (its offsets: line and column are left as they were), or None
        when the edit touches its inside."""
        if span.end <= self.prefix:
            return span
        if span.start >= self.old_end:
            return replace(span, start=span.start + self.delta, end=span.end + self.delta)
        return None


class ShiftedAnalysis:
    """An `Analysis` of `old` text, queried with offsets into the `new` text."""

    def __init__(self, analysis: Analysis, new: str) -> None:
        self._analysis = analysis
        self._edit = Edit(analysis.source, new)

    def map(self, offset: int) -> int:
        return self._edit.to_old(offset)

    def scope_at(self, offset: int) -> dict[str, Definition]:
        return self._analysis.scope_at(self.map(offset))

    @property
    def path(self) -> str | None:
        return self._analysis.path

    @property
    def source(self) -> str:
        return self._analysis.source

    @property
    def imports(self) -> dict[int, Analysis]:
        return self._analysis.imports

    @property
    def field_types(self) -> dict[str, dict[str, Type]]:
        return self._analysis.field_types

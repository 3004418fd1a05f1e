"""Character offsets <-> LSP positions, which count UTF-16 code units (the protocol's default).

The checker's spans carry 0-based code-point offsets; a character outside the BMP (an emoji) is
one code point but two UTF-16 units, so every range the server sends goes through here."""

from __future__ import annotations

from bisect import bisect_right
from typing import TYPE_CHECKING

from lsprotocol import types

if TYPE_CHECKING:  # importing the grammar package builds the parser: not needed for conversions
    from aner_lang.grammar.ast import Span


def _utf16_len(text: str) -> int:
    return len(text.encode("utf-16-le")) // 2


class LineIndex:
    """Line starts of one source text, for converting in both directions."""

    def __init__(self, source: str) -> None:
        self.source = source
        self.starts = [0]
        pos = source.find("\n")
        while pos >= 0:
            self.starts.append(pos + 1)
            pos = source.find("\n", pos + 1)

    def position(self, offset: int) -> types.Position:
        offset = max(0, min(offset, len(self.source)))
        line = bisect_right(self.starts, offset) - 1
        return types.Position(line, _utf16_len(self.source[self.starts[line] : offset]))

    def offset(self, position: types.Position) -> int:
        """The code-point offset of `position`; a column past the line's end clamps to it."""
        if position.line >= len(self.starts):
            return len(self.source)
        start = self.starts[position.line]
        end = (
            self.starts[position.line + 1] - 1
            if position.line + 1 < len(self.starts)
            else len(self.source)
        )
        units = 0
        for i in range(start, end):
            if units >= position.character:
                return i
            units += 2 if ord(self.source[i]) > 0xFFFF else 1
        return end

    def range(self, start: int, end: int) -> types.Range:
        return types.Range(self.position(start), self.position(end))

    def span_range(self, span: Span) -> types.Range:
        return self.range(span.start, span.end)

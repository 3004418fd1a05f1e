"""Where a string literal, or an interpolation `${...}` inside one, ends.

An interpolation holds any expression, strings included, and those strings may interpolate in
turn, to any depth: `"${f("a ${g("b ${x}")}")}"`. No regular expression matches that (the
quotes and braces nest), so the lexer finds a string's end with this scanner, which keeps one
entry per open string or interpolation on an explicit stack: no recursion, linear time, one
pass. Rules, the same at every depth:

* in a string, `\\` escapes the next character (never a newline), `"` closes the string, `${`
  opens an interpolation, and any other `$` is literal text;
* in an interpolation, `"` opens a string and `}` closes the interpolation (an expression has
  no braces of its own);
* a newline ends nothing: a literal and its interpolations sit on one line, so a newline before
  the end means the literal is unterminated.
"""

from __future__ import annotations

import re

# The next character that matters in each mode (everything between is skipped in one step).
_IN_STRING = re.compile(r'[\\"\n]|\$\{')
_IN_INTERPOLATION = re.compile(r'["}\n]')


def string_end(text: str, start: int) -> int | None:
    """The end (exclusive) of the string literal whose opening quote is `text[start]`, or None
    when it is unterminated on its line."""
    return _scan(text, start + 1, [False])


def interpolation_end(text: str, start: int) -> int | None:
    """The end (exclusive, past the `}`) of the interpolation whose expression starts at
    `text[start]` (just after its `${`), or None when it is not closed."""
    return _scan(text, start, [True])


def _scan(text: str, pos: int, stack: list[bool]) -> int | None:
    """Scan from `pos` until `stack` (True for an open interpolation, False for an open string)
    is empty; the position just past the character that emptied it, or None."""
    while True:
        in_interpolation = stack[-1]
        m = (_IN_INTERPOLATION if in_interpolation else _IN_STRING).search(text, pos)
        if m is None or m.group() == "\n":
            return None
        found, pos = m.group(), m.end()
        if found == "\\":
            if pos >= len(text) or text[pos] == "\n":
                return None
            pos += 1
        elif found == "${":
            stack.append(True)
        elif found == '"' and in_interpolation:
            stack.append(False)
        else:  # the `"` or `}` that closes the innermost string or interpolation
            stack.pop()
            if not stack:
                return pos

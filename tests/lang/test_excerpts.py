"""A diagnostic's source excerpt stays readable however long the line: a line longer than
`EXCERPT_WIDTH` is clipped to a window around the span, each cut side marked, and the carets stay
under the span's text wherever on the line it is."""

from __future__ import annotations

import pytest

from aner_lang.check import analyze
from aner_lang.problems.diagnostics import CLIPPED, EXCERPT_WIDTH, render

ITEMS = "1, " * 2000


@pytest.mark.parametrize(
    "source, code, spanned",
    [
        ("let x = " + "9" * 5000 + "\nprint(x)\n", "E-LITERAL", "9" * 50),  # a long span
        (f"print([{ITEMS}nope])\n", "E-UNKNOWN-NAME", "nope"),  # near the end
        (f"print([{ITEMS[: len(ITEMS) // 2]}nope, {ITEMS}])\n", "E-UNKNOWN-NAME", "nope"),
        (f"print([nope, {ITEMS}])\n", "E-UNKNOWN-NAME", "nope"),  # near the start
        ("print([nope, 1])\n", "E-UNKNOWN-NAME", "nope"),  # a short line: shown whole
    ],
    ids=["long-literal", "end", "middle", "start", "short"],
)
def test_the_excerpt_is_clipped_around_the_span(source, code, spanned):
    diag = next(d for d in analyze(source).diagnostics if d.code == code)
    _, shown, carets = render(diag, source).splitlines()[:3]
    line = source.splitlines()[0]
    assert len(shown) <= len(" 1 | ") + EXCERPT_WIDTH + 2 * len(CLIPPED)
    assert (CLIPPED in shown) == (len(line) > EXCERPT_WIDTH)
    column = carets.index("^")
    assert shown[column:].startswith(spanned)
    assert len(carets) <= len(shown)

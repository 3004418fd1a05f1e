"""Offsets of the live text map back to the analysed text through an edit."""

from __future__ import annotations

import pytest

from aner_lang.check import analyze
from aner_lang.grammar.ast import Span
from aner_lsp.stale import Edit, ShiftedAnalysis

OLD = "let a = 1\nlet bb = 2\n"


def test_offsets_before_inside_and_after_an_insertion():
    new = "let a = 1\nlet xyz = 3\nlet bb = 2\n"
    shifted = ShiftedAnalysis(analyze(OLD), new)
    assert shifted.map(3) == 3  # before the edit: unchanged
    assert shifted.map(new.index("bb")) == OLD.index("bb")  # after it: shifted back
    assert shifted.map(new.index("xyz") + 2) == OLD.index("bb")  # inside it: the edit's start
    assert set(shifted.scope_at(len(new))) == {"a", "bb"}


def test_deletion():
    new = "let bb = 2\n"
    shifted = ShiftedAnalysis(analyze(OLD), new)
    assert shifted.map(new.index("bb")) == OLD.index("bb")
    assert shifted.map(0) == 0


def _span(text: str, part: str) -> Span:
    start = text.index(part)
    return Span(1, 1, 1, 1, start, start + len(part))


@pytest.mark.parametrize(
    ("new", "moved"),
    [
        ("let a = 1\nlet bb = 2\nlet c = 3\n", True),  # after it: unchanged
        ("# top\nlet a = 1\nlet bb = 2\n", True),  # before it: shifted
        ("let a = 1\nlet bb = 2 + 5\n", True),  # right after its end
        ("let a = 1\nlet -bb = 2\n", True),  # right before its start
        ("let a = 1\nlet bxb = 2\n", False),  # inside it
        ("let a = 1\n", False),  # deleted with it
        ("let a = 1\nlet bc = 2\n", False),  # its last character replaced
    ],
)
def test_an_old_span_seen_in_the_new_text(new, moved):
    """A diagnostic of the old text keeps its text in the new one, or is dropped."""
    span = Edit(OLD, new).span_to_new(_span(OLD, "bb"))
    if moved:
        assert span is not None and new[span.start : span.end] == "bb"
    else:
        assert span is None

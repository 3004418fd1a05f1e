"""Offsets of the live text map back to the analysed text through an edit."""

from __future__ import annotations

from aner_lang.check import analyze
from aner_lsp.stale import ShiftedAnalysis

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

"""Random and mutated programs through parse, check and run: whatever the input, the only
failures that come out are Aner diagnostics, never a Python exception."""

from __future__ import annotations

import io
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from aner_lang.check import analyze
from aner_lang.interp import AnerError, ExecContext, run
from aner_lang.problems.diagnostics import Diagnostic, render

CASES = [
    p.read_text(encoding="utf-8") for p in sorted((Path(__file__).parent / "cases").glob("*.aner"))
]
# The language's own vocabulary, so random programs reach deep into the grammar and the checker.
WORDS = [
    "let",
    "fn",
    "record",
    "enum",
    "if",
    "else",
    "for",
    "in",
    "return",
    "assert",
    "import",
    "and",
    "or",
    "not",
    "true",
    "false",
    "none",
    "x",
    "y",
    "n",
    "print",
    "len",
    "range",
    "str",
    "min",
    "max",
    "join",
    "split",
    "sqrt",
    "Int",
    "Float",
    "String",
    "List",
    "Bool",
    "Storage",
    "nf4_double_quant",
    "load_model",
    "(",
    ")",
    "[",
    "]",
    "{",
    "}",
    ",",
    ":",
    ".",
    "=",
    "==",
    "+",
    "-",
    "*",
    "/",
    "%",
    "<",
    ">=",
    "?",
    "->",
    "1",
    "0",
    "2.5",
    "3e-4",
    "2 MiB",
    '"s"',
    '"${x}"',
    "\n",
    "\n",
    " ",
    "#c\n",
    "$",
    "\\",
]


def _exercise(source: str) -> None:
    analysis = analyze(source, "fuzz.aner")
    for d in analysis.diagnostics:
        assert isinstance(d, Diagnostic) and d.code != "E-INTERNAL", render(d, source)
        render(d, source)
    if analysis.errors:
        return
    try:
        run(analysis, ExecContext(script_dir=Path("/nonexistent-aner-fuzz"), stdout=io.StringIO()))
    except AnerError as e:
        assert e.diagnostic.code != "E-INTERNAL", render(e.diagnostic, source)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.sampled_from(WORDS), max_size=40).map(" ".join))
def test_random_token_soup(source: str) -> None:
    _exercise(source)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.sampled_from(CASES),
    st.lists(
        st.tuples(st.integers(0, 10_000), st.integers(0, 8), st.sampled_from(WORDS)),
        min_size=1,
        max_size=4,
    ),
)
def test_mutated_cases(source: str, edits: list[tuple[int, int, str]]) -> None:
    for pos, cut, word in edits:
        pos %= len(source) + 1
        source = source[:pos] + word + source[pos + cut :]
    _exercise(source)

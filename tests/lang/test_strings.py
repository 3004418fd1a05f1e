"""String literals: interpolations hold any expression, strings with interpolations of their own
included, to any depth up to the nesting bound; the lexer, the parser's spans and the interpreter
agree with a Python model of the value."""

from __future__ import annotations

import dataclasses
import io
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from aner_lang.check import analyze
from aner_lang.grammar import ast, parse
from aner_lang.grammar.limits import MAX_NESTING
from aner_lang.interp import ExecContext, run

# Every character that means something to the string scanner, in literal text.
_TEXT = st.text(alphabet='ab }{$"\\#,()\t', max_size=6)

Piece = tuple[str, str]
"""An expression's (Aner source, the string it evaluates to)."""


def _escape(text: str) -> str:
    return text.replace("\\", "\\\\").replace('"', '\\"').replace("\t", "\\t").replace("${", "\\${")


def _literal(parts: list[str | Piece]) -> Piece:
    """A string literal of literal text (str) and interpolated expressions (Piece); adjacent
    texts are escaped together, so a `$` before a literal `{` is escaped as `${` is."""
    source, value, text = [], [], ""
    for part in [*parts, ""]:
        if isinstance(part, str):
            text += part
            continue
        source.append(_escape(text) + "${ " + part[0] + " }")
        value.append(text + part[1])
        text = ""
    return '"' + "".join(source) + _escape(text) + '"', "".join(value) + text


def _extend(inner: st.SearchStrategy[Piece]) -> st.SearchStrategy[Piece]:
    return st.one_of(
        st.lists(st.one_of(_TEXT, inner), min_size=1, max_size=4).map(_literal),
        st.tuples(st.lists(inner, max_size=3), inner).map(
            lambda a: (
                f"join([{', '.join(s for s, _ in a[0])}], {a[1][0]})",
                a[1][1].join(v for _, v in a[0]),
            )
        ),
        st.tuples(inner, inner).map(lambda a: (f"({a[0][0]}) + {a[1][0]}", a[0][1] + a[1][1])),
    )


_EXPRS = st.recursive(_TEXT.map(lambda t: _literal([t])), _extend, max_leaves=24)


def _nodes(node: Any) -> Iterator[Any]:
    yield node
    for field in dataclasses.fields(node):
        value = getattr(node, field.name)
        for child in value if isinstance(value, tuple) else (value,):
            if dataclasses.is_dataclass(child) and not isinstance(child, ast.Span):
                yield from _nodes(child)


def _printed(source: str) -> str:
    analysis = analyze(source, "t.aner")
    assert not analysis.errors, analysis.errors
    out = io.StringIO()
    run(analysis, ExecContext(script_dir=Path.cwd(), stdout=out))
    return out.getvalue()


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_EXPRS)
def test_nested_interpolations_evaluate_like_the_model(piece: Piece) -> None:
    source, value = piece
    program = f"let s = {source}\nprint(s)\n"
    assert _printed(program) == value + "\n"
    module, diagnostics = parse(program)
    assert diagnostics == []
    for node in _nodes(module.body[0]):
        text = program[node.span.start : node.span.end]
        if isinstance(node, ast.StringLit):
            assert text[0] == text[-1] == '"', text
        elif isinstance(node, ast.Call):
            assert text.startswith("join(") and text.endswith(")"), text


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.integers(1, MAX_NESTING - 5), _TEXT)
def test_strings_nest_in_interpolations_to_the_bound(depth: int, text: str) -> None:
    source, value = _literal([text])
    for level in range(depth):
        source, value = _literal([str(level), (source, value)])
    assert _printed(f"print({source})\n") == value + "\n"


def test_nesting_past_the_bound_is_one_located_error() -> None:
    source = '"x"'
    for _ in range(MAX_NESTING * 20):
        source = '"${' + source + '}"'
    _, diagnostics = parse(f"let s = {source}\n")
    assert [d.code for d in diagnostics] == ["E-NESTING"]


@given(_EXPRS, st.data())
@settings(
    max_examples=100,
    deadline=None,  # the pieces below are filtered to string literals without `#`
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)
def test_a_string_left_open_at_any_depth_is_located(piece: Piece, data: st.DataObject) -> None:
    source = piece[0]
    # any quote but the outermost opening one (without it, the text would be code, not a string)
    quotes = [i for i, c in enumerate(source) if i and c == '"' and source[i - 1] != "\\"]
    # a string literal with no `#` (a `+` of pieces, or a `join` of none, can lose a quote and
    # stay valid, and so can code whose lost quote turns a `#` into a comment: `("") + "#"`
    # without its last-but-one quote is `("") + #"`)
    assume(source.startswith('"') and "#" not in source and quotes)
    cut = data.draw(st.sampled_from(quotes))
    program = f"let s = {source[:cut] + source[cut + 1 :]}\nprint(1)\n"
    _, diagnostics = parse(program)
    assert diagnostics, program
    first = diagnostics[0]
    assert first.code == "E-SYNTAX" and first.span is not None and first.span.line == 1
    assert "no closing" in first.message or "unexpected" in first.message, first.message


def test_the_newcomers_example_checks_and_runs() -> None:
    program = (
        'fn chat(a: String, q: String) -> String {\n  return "${a}: ${q}"\n}\n'
        'let a = "m"\nlet c = "France"\n'
        'print("${chat(a, "capital of ${c}?")}")\n'
    )
    assert _printed(program) == "m: capital of France?\n"

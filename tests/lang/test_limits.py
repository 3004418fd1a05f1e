"""The language's bounds (aner_lang/grammar/limits.py) and its checked arithmetic: each hostile
script of the hardening review is a located diagnostic naming the bound, never a traceback."""

from __future__ import annotations

import io
import math
import os
from pathlib import Path

import pytest

from aner_lang.check import analyze
from aner_lang.grammar.limits import MAX_NESTING
from aner_lang.interp import AnerError, ExecContext, run
from aner_lang.problems import diagnostics


def _diagnostic(source: str, tmp_path: Path) -> diagnostics.Diagnostic:
    """The first error of checking, else of running, `source` (a script in `tmp_path`)."""
    analysis = analyze(source, str(tmp_path / "s.aner"))
    if analysis.errors:
        return analysis.errors[0]
    with pytest.raises(AnerError) as info:
        run(analysis, ExecContext(script_dir=tmp_path, stdout=io.StringIO()))
    return info.value.diagnostic


DEEP = 3000


@pytest.mark.parametrize(
    "expression",
    [
        "not " * DEEP + "true",
        "-" * DEEP + "1",
        "+".join(["1"] * DEEP),
        "abs(" * DEEP + "1" + ")" * DEEP,
        "[" * DEEP + "]" * DEEP,
    ],
    ids=["not", "minus", "plus", "calls", "lists"],
)
def test_deep_nesting_is_a_located_error(expression: str, tmp_path: Path) -> None:
    d = _diagnostic(f"let a = 1\nlet deep = {expression}\nprint(a)\n", tmp_path)
    assert d.code == "E-NESTING" and d.span is not None and d.span.line == 2
    assert str(MAX_NESTING) in d.message


def test_nesting_just_under_the_bound_checks_and_runs(tmp_path: Path) -> None:
    out = io.StringIO()
    analysis = analyze("print(" + "-" * (MAX_NESTING - 5) + "1)\n", "s.aner")
    assert not analysis.errors
    run(analysis, ExecContext(script_dir=tmp_path, stdout=out))
    assert out.getvalue() == "-1\n"


@pytest.mark.parametrize(
    "source, code, words",
    [
        ("print(" + "9" * 5000 + ")", "E-LITERAL", "longer than 1,000 characters"),
        ("print(9223372036854775808)", "E-LITERAL", "largest Int"),
        ("print(" + "9" * 300 + " GiB)", "E-LITERAL", "largest Bytes"),
        ("print(1e999)", "E-LITERAL", "largest Float"),
        ("let a = 9223372036854775807\nprint(a + 1)", "E-OVERFLOW", "overflows"),
        ("let a = 3037000500\nprint(str(a * a))", "E-OVERFLOW", "overflows"),
        ("let a = -9223372036854775807 - 1\nprint(-a)", "E-OVERFLOW", "overflows"),
        ("print(float(9223372036854775807) * 1e300 * 1e300)", "E-OVERFLOW", "overflows"),
        ("print(exp(1e10))", "E-OVERFLOW", "exp"),
        ("print(pow(10.0, 400.0))", "E-OVERFLOW", "pow"),
        ("print(int(1e300))", "E-OVERFLOW", "int"),
        ("print(round(1e300))", "E-OVERFLOW", "round"),
        ("print(sqrt(1e308 * 10.0))", "E-OVERFLOW", "overflows"),
        ("print(len(range(1000000000)))", "E-LIMIT", "10,000,000"),
        (
            'let s = "ab"\nfor i in range(100) {\n  s = s + s\n}\nprint(len(s))',
            "E-LIMIT",
            "characters",
        ),
        ('print(read_text("a\\0b"))', "E-FILE-NAME", "NUL"),
        ('print(len(read_text("/dev/zero")))', "E-FILE-KIND", "not a regular file"),
        ("enum Color { red, green }\nprint(Color)", "E-TYPE", "is an enum, not a value"),
    ],
)
def test_hostile_values_are_errors_naming_the_bound(
    source: str, code: str, words: str, tmp_path: Path
) -> None:
    d = _diagnostic(source + "\n", tmp_path)
    assert (d.code, d.span is not None) == (code, True), d
    assert words in d.message, d.message
    assert not (tmp_path / "out.json").exists()


def test_non_finite_floats_have_no_integer_and_no_json(tmp_path: Path) -> None:
    """NaN reaches a script only from a model's numbers; the builtins refuse it, located."""
    from aner_lang.interp import corelib
    from aner_lang.problems.errors import AnerRuntimeError

    with pytest.raises(AnerRuntimeError, match="no integer value") as info:
        corelib.int_(math.nan)
    assert info.value.code == "E-VALUE"
    ctx = ExecContext(script_dir=tmp_path, stdout=io.StringIO())
    with pytest.raises(AnerRuntimeError, match=r"the value\[1\]\['a'\] is inf") as info:
        corelib.write_json(ctx, "out.json", [1.0, {"a": math.inf}])
    assert info.value.code == "E-VALUE" and not (tmp_path / "out.json").exists()


def test_write_json_never_replaces_a_file_unasked(tmp_path: Path) -> None:
    (tmp_path / "out.json").write_text("mine")
    d = _diagnostic('write_json("out.json", [1])\n', tmp_path)
    assert d.code == "E-FILE-EXISTS" and (tmp_path / "out.json").read_text() == "mine"
    analysis = analyze('write_json("out.json", [1], overwrite: true)\n', "s.aner")
    run(analysis, ExecContext(script_dir=tmp_path, stdout=io.StringIO()))
    assert (tmp_path / "out.json").read_text().split() == ["[", "1", "]"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out.json"]


def test_import_of_a_fifo_or_device_is_refused_without_blocking(tmp_path: Path) -> None:
    fifo = tmp_path / "pipe.aner"
    os.mkfifo(fifo)
    for target in (fifo, Path("/dev/urandom")):
        analysis = analyze(f'import "{target}"\n', str(tmp_path / "s.aner"))
        assert [d.code for d in analysis.errors] == ["E-IMPORT"]
        assert "not a regular file" in analysis.errors[0].message


def test_rendering_many_diagnostics_indexes_the_source_once() -> None:
    source = "".join(f"let x{i} = {i}\n" for i in range(5000))
    analysis = analyze(source + "print(y)\n" * 2000, "s.aner")
    diagnostics._line_starts.cache_clear()
    for d in analysis.errors:
        diagnostics.render(d, analysis.source)
    info = diagnostics._line_starts.cache_info()
    assert len(analysis.errors) == 2000 and info.misses == 1


def test_ctrl_c_during_a_run_is_a_line_not_a_traceback(tmp_path: Path) -> None:
    import signal
    import subprocess
    import sys

    script = tmp_path / "loop.aner"
    script.write_text(
        'print("started")\nlet total = 0\nfor i in range(10000000) {\n  total = total + i\n}\n'
    )
    proc = subprocess.Popen(
        [sys.executable, "-m", "aner_lang.cli", "run", str(script)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None and proc.stdout.readline() == "started\n"
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 130 and err == "aner: interrupted\n", err

"""Golden tests: every tests/lang/cases/*.aner file, with its expectations written inline.

* `#! error[CODE] text` / `#! warning[CODE] text` at the end of a line: the checker reports a
  diagnostic with that code on that line whose message contains `text` (text is optional).
  Every diagnostic must be expected and every expectation must be met.
* `#! runtime[CODE] text`: the file checks cleanly, and running it fails on that line.
* `#> text` lines: the expected output of running the file, in order.
"""

from __future__ import annotations

import io
import re
from pathlib import Path

import pytest

from aner_lang.check import analyze
from aner_lang.interp import AnerError, ExecContext, run

CASES = sorted((Path(__file__).parent / "cases").glob("*.aner"))
_EXPECT = re.compile(r"#!\s*(error|warning|runtime)\[([A-Z0-9-]+)\]\s*(.*)$")


def _expectations(source: str):
    static, runtime, output = [], [], []
    for n, line in enumerate(source.splitlines(), start=1):
        m = _EXPECT.search(line)
        if m:
            entry = (n, m.group(2), m.group(3).strip())
            (runtime if m.group(1) == "runtime" else static).append((m.group(1),) + entry)
        elif line.lstrip().startswith("#>"):
            output.append(line.lstrip()[2:].strip())
    return static, runtime, output


@pytest.mark.parametrize("case", CASES, ids=[c.stem for c in CASES])
def test_case(case: Path) -> None:
    source = case.read_text(encoding="utf-8")
    static, runtime, output = _expectations(source)
    analysis = analyze(source, str(case))
    got = [
        (d.severity, d.span.line if d.span else 0, d.code, " ".join((d.message,) + d.notes))
        for d in analysis.diagnostics
    ]
    for severity, line, code, text in static:
        match = [g for g in got if g[:3] == (severity, line, code) and text in g[3]]
        assert match, f"line {line}: expected {severity}[{code}] {text!r}; got {got}"
        got.remove(match[0])
    assert not got, f"unexpected diagnostics: {got}"
    if any(s[0] == "error" for s in static):
        return
    out = io.StringIO()
    ctx = ExecContext(script_dir=case.parent, stdout=out, script_path=case)
    if runtime:
        with pytest.raises(AnerError) as info:
            run(analysis, ctx)
        d = info.value.diagnostic
        _, line, code, text = runtime[0]
        assert (d.span.line, d.code) == (line, code) and text in d.message, d
    else:
        run(analysis, ctx)
    printed = [line.strip() for line in out.getvalue().splitlines()]
    assert printed == output

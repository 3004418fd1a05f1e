"""The language core end to end: parser recovery and spans, the analysis API, the interpreter's
error reporting, the CLI, the generated reference, the doc checker and start-up without torch."""

from __future__ import annotations

import io
import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from aner_lang.builtins import registry
from aner_lang.builtins.reference import render_reference
from aner_lang.builtins.spec import Builtin
from aner_lang.check import analyze
from aner_lang.check.docs_check import check_markdown
from aner_lang.cli import main
from aner_lang.grammar import ast, parse
from aner_lang.host.process_clock import phases
from aner_lang.interp import AnerError, ExecContext, run
from aner_lang.interp.boundary import load_impl
from aner_lang.problems.errors import NativeBackendUnavailable

ROOT = Path(__file__).resolve().parents[2]


def _run(source: str, tmp_path: Path | None = None) -> str:
    analysis = analyze(source, "t.aner")
    assert not analysis.errors, analysis.errors
    out = io.StringIO()
    run(analysis, ExecContext(script_dir=tmp_path or Path.cwd(), stdout=out))
    return out.getvalue()


def test_parse_recovers_from_two_broken_declarations() -> None:
    source = "let a = 1\nfn f(x: Int {\n  return x\n}\nlet b = (2\nlet c = a + 1\nrecord R { x Int }\nprint(c)\n"
    module, diags = parse(source, "broken.aner")
    assert [d.span.line for d in diags] == [2, 5, 7]
    assert all(d.code == "E-SYNTAX" and d.path == "broken.aner" for d in diags)
    names = [s.name for s in module.body if isinstance(s, ast.Let)]
    assert names == ["a", "c"] and isinstance(module.body[-1], ast.ExprStmt)


def test_spans_match_the_source_text() -> None:
    source = 'let x = f(a: 1,\n  b: "s ${y + 1}")\n'
    module, diags = parse(source)
    assert not diags
    call = module.body[0].value
    assert source[call.span.start : call.span.end] == source.strip()[len("let x = ") :]
    arg_b = call.args[1]
    assert (arg_b.name_span.line, arg_b.name_span.col) == (2, 3)
    inner = arg_b.value.parts[1]
    assert source[inner.span.start : inner.span.end] == "y + 1" and inner.span.line == 2


def test_analysis_api_definitions_references_scopes_types_calls(tmp_path: Path) -> None:
    lib = tmp_path / "lib.aner"
    lib.write_text("fn double(n: Int) -> Int {\n  return 2 * n\n}\nlet shared = 5\n")
    source = (
        'import "lib.aner"\nfn g(rank: Int, scale: Float = 1.0) -> Float {\n'
        "  let t = double(rank)\n  return t * scale\n}\nprint(g(shared, scale: 2.0))\n"
    )
    main_path = tmp_path / "main.aner"
    a = analyze(source, str(main_path))
    assert not a.diagnostics
    # a reference across the import resolves to the definition in lib.aner
    at = source.index("double(rank)")
    d = a.definition_at(at + 1)
    assert (d.name, d.kind, d.path, d.span.line) == ("double", "fn", str(lib), 1)
    assert d.type == "fn double(n: Int) -> Int"
    # scope view inside g: locals with types, module names, imported names; not later lets
    names = a.scope_at(source.index("return t"))
    assert {k: names[k].type for k in ("rank", "scale", "t", "shared")} == {
        "rank": "Int",
        "scale": "Float",
        "t": "Int",
        "shared": "Int",
    }
    assert "t" not in a.scope_at(source.index("let t"))
    assert a.type_at(source.index("t * scale") + 4) == "Float"
    call = a.call_at(source.index("scale: 2.0") + 2)
    assert (
        call.name == "g"
        and call.kind == "fn"
        and call.active_parameter(source.index("scale: 2.0") + 2) == "scale"
    )
    builtin_call = a.call_at(source.index("print(") + 6)
    assert builtin_call.builtin is not None and builtin_call.builtin.name == "print"
    assert len(a.references_to(names["rank"])) == 1


def test_overload_resolution_is_static() -> None:
    a = analyze('let n = len([1, 2])\nlet m = len("abc")\nprint(n + m)\n')
    kinds = sorted(c.builtin.params[0].type for c in a.calls.values() if c.name == "len")
    assert kinds == ["List[Any]", "String"]


def test_import_cycle_is_reported(tmp_path: Path) -> None:
    (tmp_path / "a.aner").write_text('import "b.aner"\nlet x = 1\n')
    (tmp_path / "b.aner").write_text('import "a.aner"\nlet y = 2\n')
    a = analyze((tmp_path / "a.aner").read_text(), str(tmp_path / "a.aner"))
    cycle = [d for d in a.diagnostics if d.code == "E-IMPORT-CYCLE"]
    assert len(cycle) == 1 and cycle[0].span.line == 1
    assert cycle[0].message.endswith(
        "a.aner -> " + str(tmp_path / "b.aner") + " -> " + str(tmp_path / "a.aner")
    )


def test_imports_run(tmp_path: Path) -> None:
    (tmp_path / "lib.aner").write_text(
        "record P { x: Int }\nfn make(x: Int) -> P {\n  return P(x: x)\n}\n"
    )
    src = 'import "lib.aner"\nprint(make(4).x)\n'
    a = analyze(src, str(tmp_path / "main.aner"))
    assert not a.errors, a.errors
    out = io.StringIO()
    run(a, ExecContext(script_dir=tmp_path, stdout=out))
    assert out.getvalue() == "4\n"


def test_defaults_of_an_imported_fn_and_record_are_its_own_module(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)  # `_run` names the script t.aner, relative to the working directory
    (tmp_path / "lib.aner").write_text(
        "enum Level { low, high }\n"
        'fn f(n: Int, level: Level = low, k: Float = 2 + 3) -> String {\n  return "${n} ${level} ${k}"\n}\n'
        "record R {\n  level: Level = high\n}\n"
    )
    out = _run('import "lib.aner"\nprint(f(1))\nprint(f(2, level: high))\nprint(R())\n', tmp_path)
    assert out.splitlines() == ["1 low 5.0", "2 high 5.0", "R(level: high)"]


def test_runtime_error_has_span_and_aner_stack() -> None:
    src = (
        "fn inner(x: Int) -> Float {\n  return 1 / x\n}\n"
        "fn outer() -> Float {\n  return inner(0)\n}\nprint(outer())\n"
    )
    with pytest.raises(AnerError) as info:
        _run(src)
    d = info.value.diagnostic
    assert (d.code, d.span.line, d.span.col) == ("E-DIV-ZERO", 2, 12)
    assert d.notes == ("called from `inner` at t.aner:5:10", "called from `outer` at t.aner:7:7")


def test_runtime_constraint_and_internal_error(monkeypatch) -> None:
    with pytest.raises(AnerError) as info:
        _run("let s = 0\nprint(range(0, 3, step: s))\n")
    assert info.value.diagnostic.code == "E-CONSTRAINT"
    import aner_lang.interp.boundary as boundary
    import aner_lang.interp.corelib as corelib

    def broken(x):
        raise ValueError("boom")

    monkeypatch.setattr(corelib, "exp", broken)
    monkeypatch.setattr(boundary, "_impl_cache", {})
    with pytest.raises(AnerError) as info:
        _run("print(exp(1.0))\n")
    d = info.value.diagnostic
    assert d.code == "E-INTERNAL" and "boom" in d.message and d.span.line == 1


def test_missing_native_package_is_a_clear_error() -> None:
    b = Builtin(
        "needs_pkg",
        (),
        "Int",
        "doc",
        "aner_no_such_pkg.mod:f",
        native=True,
        requires=("aner_no_such_pkg",),
    )
    with pytest.raises(NativeBackendUnavailable) as info:
        load_impl(b)
    assert "aner_no_such_pkg" in info.value.message and "needs_pkg" in info.value.message


def test_importing_a_builtins_implementation_counts_as_the_imports_phase() -> None:
    """The `imports` phase of a run's start-up (`host.process_clock`) is the time spent importing
    builtins' implementations on first use."""
    b = Builtin("fresh", (), "Int", "doc", "json:dumps", native=True)
    before = phases().get("imports", 0.0)
    assert load_impl(b) is json.dumps
    assert phases()["imports"] > before


def test_files_builtins(tmp_path: Path) -> None:
    (tmp_path / "in.txt").write_text("hi there")
    out = _run(
        'let t = read_text("in.txt")\nwrite_json("out/r.json", [len(t)])\nprint(t)\n', tmp_path
    )
    assert out == "hi there\n" and (tmp_path / "out/r.json").read_text().split() == ["[", "8", "]"]
    with pytest.raises(AnerError) as info:
        _run('print(read_text("missing.txt"))\n', tmp_path)
    assert (
        info.value.diagnostic.code == "E-FILE-MISSING"
        and "missing.txt" in info.value.diagnostic.message
    )


def test_cli_exit_codes(tmp_path: Path, capsys) -> None:
    good, bad = tmp_path / "good.aner", tmp_path / "bad.aner"
    good.write_text('print("ok")\n')
    bad.write_text("let x = 1 +\nprint(y)\n")
    assert main(["check", str(good)]) == 0
    assert main(["check", str(bad)]) == 1
    err = capsys.readouterr().err
    assert f"{bad}:1:" in err and "^" in err
    assert main(["run", str(good)]) == 0 and capsys.readouterr().out == "ok\n"
    assert main(["check", str(tmp_path / "nope.aner")]) == 1
    assert main([]) == 2 and main(["frobnicate"]) == 2


def test_builtins_reference_is_up_to_date() -> None:
    committed = (ROOT / "docs" / "builtins.md").read_text(encoding="utf-8")
    assert committed == render_reference(registry()), (
        "docs/builtins.md is stale: run `aner builtins -o docs/builtins.md`"
    )


def test_docs_examples_check(tmp_path: Path) -> None:
    for md in sorted((ROOT / "docs").rglob("*.md")):
        diags, _ = check_markdown(md)
        assert not diags, [f"{d.path}:{d.span.line if d.span else 0}: {d.message}" for d in diags]
    doc = tmp_path / "x.md"
    doc.write_text(
        "intro\n\n```aner\nlet a = 1\nprint(b)\n```\n\n```aner error\nprint(1)\n```\n\n```aner skip\n???\n```\n"
    )
    diags, checked = check_markdown(doc)
    assert checked == 2
    assert [(d.code, d.span.line) for d in diags] == [("E-UNKNOWN-NAME", 5), ("E-DOC-NO-ERROR", 8)]


def test_front_end_does_not_import_torch(tmp_path: Path) -> None:
    """`aner check`, with its checks against the files the script reads and the machine's
    devices, imports none of the native packages."""
    script = tmp_path / "s.aner"
    (tmp_path / "x.gguf").write_bytes(b"")
    (tmp_path / "d.jsonl").write_text('{"messages": [{"role": "assistant", "content": "hi"}]}\n')
    script.write_text(
        'let m = load_model("x.gguf", storage: nf4_double_quant, device: cpu)\n'
        'let d = load_data("d.jsonl", format: chat)\n'
        "print(m)\nprint(d)\n"
    )
    code = textwrap.dedent(f"""
        import sys
        import aner_lang
        from aner_lang.cli import main
        rc = main(["check", {str(script)!r}])
        heavy = [m for m in ("torch", "numpy", "gguf", "cupy") if m in sys.modules]
        print(rc, heavy)
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.stdout.split("\n")[0] == "0 []", out.stdout + out.stderr


def test_broken_function_is_salvaged_for_the_editor() -> None:
    source = (
        "let base = 3\nfn f(rank: Int) -> Int {\n  let a = rank * 2\n"
        "  let b = lora(base, ra\n  return a\n}\nlet c = nope\n"
    )
    a = analyze(source, "s.aner")
    assert [(d.code, d.span.line) for d in a.diagnostics] == [
        ("E-SYNTAX", 5),
        ("E-UNKNOWN-NAME", 7),
    ]
    visible = a.scope_at(source.index("return a"))
    assert visible["a"].type == "Int" and visible["rank"].type == "Int"
    assert analyze("fn g() {\n  let q = 1\n  print(q)\n").scope_at(30)["q"].kind == "let"


def test_deep_recursion_is_a_diagnostic_with_a_short_stack() -> None:
    with pytest.raises(AnerError) as info:
        _run("fn down(n: Int) -> Int {\n  return down(n + 1)\n}\nprint(down(0))\n")
    d = info.value.diagnostic
    assert (
        d.code == "E-RECURSION" and len(d.notes) <= 12 and any("more calls" in n for n in d.notes)
    )

"""The error-code registry (`aner_lang.problems.error_codes`): every code the source can report is
registered and every entry is reported somewhere, each example does what its kind says,
`docs/errors.md` is the generated text, and `aner explain` prints every entry."""

from __future__ import annotations

import ast
import io
import re
from pathlib import Path

import pytest

from aner_lang.check import Analysis, analyze
from aner_lang.check.before_run import check_before_run
from aner_lang.cli import main
from aner_lang.interp import AnerError, ExecContext, run
from aner_lang.problems.error_codes import ERROR_CODES, ErrorCode, ExampleKind, lookup
from aner_lang.problems.error_reference import render_markdown

ROOT = Path(__file__).resolve().parents[2]
_CODE = re.compile(r"^[EW]-[A-Z0-9]+(-[A-Z0-9]+)*$")
_REGISTRY = ROOT / "aner_lang" / "error_codes.py"


def _codes_in_source() -> dict[str, list[str]]:
    """Every string constant that is a code, in aner_lang/ and lsp/aner_lsp/ (the registry
    itself aside), with where it occurs."""
    found: dict[str, list[str]] = {}
    for root in (ROOT / "aner_lang", ROOT / "lsp" / "aner_lsp"):
        for path in sorted(root.rglob("*.py")):
            if path == _REGISTRY:
                continue
            for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
                if (
                    isinstance(node, ast.Constant)
                    and isinstance(node.value, str)
                    and _CODE.match(node.value)
                ):
                    where = f"{path.relative_to(ROOT)}:{node.lineno}"
                    found.setdefault(node.value, []).append(where)
    return found


def _of_kind(kind: ExampleKind) -> list[ErrorCode]:
    return [e for e in ERROR_CODES.values() if e.kind is kind]


def _id(entry: ErrorCode) -> str:
    return entry.code


def test_every_code_in_the_source_is_registered() -> None:
    missing = {c: where for c, where in _codes_in_source().items() if c not in ERROR_CODES}
    assert not missing, f"add these codes to aner_lang/problems/error_codes.py: {missing}"


def test_every_registered_code_is_reported_somewhere() -> None:
    dead = sorted(set(ERROR_CODES) - set(_codes_in_source()))
    assert not dead, f"registered but raised nowhere: {dead}"


def test_entries_are_well_formed() -> None:
    for code, e in ERROR_CODES.items():
        assert code == e.code and _CODE.match(code), code
        assert e.title and "\n" not in e.title and not e.title.endswith("."), code
        assert e.explanation and e.example, code


def test_lookup_accepts_any_letter_case_but_only_whole_codes() -> None:
    assert lookup("e-gguf-truncated") is ERROR_CODES["E-GGUF-TRUNCATED"]
    assert lookup("W-Unused") is ERROR_CODES["W-UNUSED"]
    assert lookup("GGUF-TRUNCATED") is None


def test_docs_errors_md_is_generated_from_the_registry() -> None:
    committed = (ROOT / "docs" / "errors.md").read_text(encoding="utf-8")
    assert committed == render_markdown(), (
        "docs/errors.md is stale: run `aner explain --markdown -o docs/errors.md`"
    )


def _aner_check(entry: ErrorCode, folder: Path) -> Analysis:
    """The example checked as `aner check` checks it, in an empty folder."""
    return check_before_run(entry.example, str(folder / "example.aner"))


@pytest.mark.parametrize("entry", _of_kind(ExampleKind.CHECK), ids=_id)
def test_check_example_reports_exactly_its_code(entry: ErrorCode, tmp_path: Path) -> None:
    analysis = _aner_check(entry, tmp_path)
    assert {d.code for d in analysis.diagnostics} == {entry.code}, analysis.diagnostics


@pytest.mark.parametrize("entry", _of_kind(ExampleKind.RUN), ids=_id)
def test_run_example_checks_cleanly_and_fails_with_its_code(
    entry: ErrorCode, tmp_path: Path
) -> None:
    analysis = _aner_check(entry, tmp_path)
    assert not analysis.diagnostics, analysis.diagnostics
    with pytest.raises(AnerError) as info:
        run(analysis, ExecContext(script_dir=tmp_path, stdout=io.StringIO()))
    if info.value.diagnostic.code == "E-NATIVE-UNAVAILABLE":
        pytest.skip("the example needs the native backend")
    assert info.value.diagnostic.code == entry.code, info.value.diagnostic


@pytest.mark.parametrize("entry", _of_kind(ExampleKind.SCRIPT), ids=_id)
def test_script_example_checks_cleanly(entry: ErrorCode, tmp_path: Path) -> None:
    analysis = analyze(entry.example, str(tmp_path / "example.aner"))
    assert not analysis.diagnostics, analysis.diagnostics
    # its setting's files are absent here, and this machine may lack what it describes; but a
    # code `aner check` reports before the run is not one the script "fails with when run"
    here = {d.code for d in _aner_check(entry, tmp_path).diagnostics}
    assert entry.code not in here, here


def test_explain_prints_every_entry(capsys: pytest.CaptureFixture[str]) -> None:
    for code, e in ERROR_CODES.items():
        for spelling in (code, code.lower()):
            assert main(["explain", spelling]) == 0
            out = capsys.readouterr().out
            assert out.startswith(f"{code}: {e.title}\n"), out
            assert e.explanation in out and e.example in out


def test_explain_rejects_an_unknown_code_with_a_suggestion(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert main(["explain", "E-SYNTAXX"]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert "unknown error code 'E-SYNTAXX'; did you mean E-SYNTAX?" in captured.err
    assert main(["explain", "Q-123"]) == 2
    err = capsys.readouterr().err
    assert "unknown error code 'Q-123'" in err and "did you mean" not in err


def test_explain_without_a_code_lists_every_code(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["explain"]) == 0
    lines = capsys.readouterr().out.splitlines()
    for code, e in ERROR_CODES.items():
        assert any(line.split() == [code, *e.title.split()] for line in lines), code


def test_explain_markdown_writes_the_reference(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "docs" / "errors.md"
    assert main(["explain", "--markdown", "-o", str(out)]) == 0
    assert out.read_text(encoding="utf-8") == render_markdown()
    assert main(["explain", "E-SYNTAX", "--markdown"]) == 2
    assert main(["explain", "E-SYNTAX", "-o", str(out)]) == 2
    assert "--markdown" in capsys.readouterr().err

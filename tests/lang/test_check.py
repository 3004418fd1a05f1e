"""The checker's contracts that a golden case cannot show: a mistake in a registry constraint is
a bug that surfaces, and `analyze` turns a bug in the checker into a diagnostic, keeping the
parse."""

from __future__ import annotations

import pytest

import aner_lang.check as check
from aner_lang.builtins import Registry, registry
from aner_lang.builtins.spec import Builtin, Constraint, Declarations, Param
from aner_lang.check.checker import analyze_module


def _registry_with(builtin: Builtin) -> Registry:
    reg = registry()
    decls = Declarations(
        builtins=(builtin,), enums=tuple(reg.enums.values()), types=tuple(reg.types.values())
    )
    return Registry([decls])


def test_a_constraint_that_cannot_be_evaluated_surfaces() -> None:
    wrong = Builtin(
        "halve",
        (Param("n", "Int"),),
        "Int",
        "A builtin whose constraint compares an Int with a String.",
        "aner_lang.nowhere:halve",
        constraints=(Constraint('n >= "1"', "n must be at least 1"),),
    )

    def no_imports(path: str, importer: str | None) -> tuple[str, str]:
        raise OSError(path)

    with pytest.raises(TypeError):
        analyze_module("halve(2)\n", "t.aner", _registry_with(wrong), no_imports, ("t.aner",), {})


def test_a_bug_in_the_checker_is_a_diagnostic_after_the_syntax_errors(monkeypatch) -> None:
    def broken(*args: object, **kwargs: object) -> None:
        raise RuntimeError("boom")

    monkeypatch.setattr(check, "analyze_module", broken)
    a = check.analyze("let x = 1\nlet = 2\n", "t.aner")
    assert [d.code for d in a.diagnostics] == ["E-SYNTAX", "E-INTERNAL"]
    assert "boom" in a.diagnostics[1].message and a.diagnostics[1].path == "t.aner"
    assert [type(s).__name__ for s in a.module.body] == ["Let"]

"""The checks that follow `analyze` wherever a script is about to be run or is checked as a file:
`aner check`, `aner run` and the language server all call `surroundings`, so the editor and the
command line report the same diagnostics for the same file.

They ask the world outside the text: the files the script reads and the machine
(`environment`), and whether this installation has the packages its native builtins need
(`native`). Paths are relative to the directory of the file that names them.
"""

from __future__ import annotations

from aner_lang.check.analysis import Analysis
from aner_lang.check.environment import environment_diagnostics
from aner_lang.check.native import native_unavailable
from aner_lang.problems.diagnostics import Diagnostic


def surroundings(analysis: Analysis, *, before_running: bool) -> list[Diagnostic]:
    """The diagnostics of `analysis` against its files, the machine and this installation (a
    missing package is an error `before_running`, a warning otherwise)."""
    return environment_diagnostics(analysis) + native_unavailable(
        analysis, before_running=before_running
    )

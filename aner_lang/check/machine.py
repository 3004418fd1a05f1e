"""Everything `aner check` and `aner run` report before a run, in one call: the language's own
checks (`analyze`), then what this machine and the script's files say (`environment`: a model
path that names nothing, `device: cuda` without a GPU), then whether this installation has the
packages the script's native builtins need (`native`: an error before running, a warning for
`aner check`). Tests of documented examples check through here, so an example said to check
cleanly does so under `aner check`, not only under the type checker."""

from __future__ import annotations

from aner_lang.check import Analysis, analyze
from aner_lang.check.environment import environment_diagnostics
from aner_lang.check.native import native_unavailable


def check_here(source: str, path: str, *, before_running: bool) -> Analysis:
    """`analyze(source, path)` with the environment's and the installation's diagnostics added."""
    analysis = analyze(source, path)
    analysis.diagnostics += environment_diagnostics(analysis)
    analysis.diagnostics += native_unavailable(analysis, before_running=before_running)
    return analysis

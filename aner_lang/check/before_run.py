"""`check_before_run`: every check that runs before a script runs, in one call.

`aner run` refuses a script this finds errors in, `aner check` prints what it finds, and the
language server shows the same diagnostics, so the three never disagree. In order:

1. `analyze`: the script as text (syntax, names, types, the registry's constraints over literal
   arguments), the same on any machine;
2. `surroundings`: the files the script reads and writes and this machine, refusing only what
   fails on every path through the script (`aner_lang.check.environment`), and whether this
   installation has the packages the script's native builtins need (an error before a run, a
   warning otherwise). The language server calls `surroundings` on the analysis it already
   holds, after a pause in typing.

`aner run` then runs one check that reads the model's tokenizer, which the editor and `aner
check` leave out: training data that leaves no token to score
(`aner_lang.runtime.train.data_precheck`). Nothing here imports torch.
"""

from __future__ import annotations

from aner_lang.check import Analysis, analyze
from aner_lang.check.surroundings import surroundings


def check_before_run(
    source: str,
    path: str | None = None,
    *,
    running: bool = False,
) -> Analysis:
    """The analysis of `source` (the file at `path`, if it has one) with the diagnostics of every
    check before a run; `running` when the script is about to run (a missing native package is
    then an error)."""
    analysis = analyze(source, path)
    analysis.diagnostics += surroundings(analysis, before_running=running)
    return analysis

"""The fuzz suite (`fuzz.py`) as a test: every target, a fixed number of examples each, in a
child process under its memory limit; set ANER_FUZZ_EXAMPLES for more (`fuzz.py --seconds` runs a
long search)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

FUZZ = Path(__file__).with_name("fuzz.py")


@pytest.mark.parametrize("target", ["lang", "gguf", "checkpoint", "lsp"])
def test_fuzz_target_finds_no_traceback_and_no_internal_error(target: str) -> None:
    examples = os.environ.get("ANER_FUZZ_EXAMPLES", "80")
    done = subprocess.run(
        [sys.executable, str(FUZZ), target, "--examples", examples],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-8000:]
    # The search reached the checks it is there for: some inputs refused with a located code
    # (the language server: every example's closing request answered).
    reached = "'answered': " if target == "lsp" else "'E-"
    assert "no failure" in done.stdout and reached in done.stdout, done.stdout

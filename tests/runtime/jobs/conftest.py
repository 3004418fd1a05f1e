"""Every job test has its own job database (ANER_DATA_DIR) and, unless it says, no GPU."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest


@pytest.fixture(autouse=True)
def data_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    folder = tmp_path / "aner-data"
    monkeypatch.setenv("ANER_DATA_DIR", str(folder))
    monkeypatch.setenv("ANER_GPUS", "0")
    monkeypatch.setenv("ANER_CACHE_DIR", str(tmp_path / "cache"))
    return folder


def _aner(*args: str, cwd: Path | None = None, timeout: float = 600) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "aner_lang.cli", *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=timeout,
        env=dict(os.environ),
    )


@pytest.fixture
def aner():
    """The `aner` command in a fresh process (the test's environment, with its data dir)."""
    return _aner

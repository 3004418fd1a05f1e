"""A real `aner run` in a child process, for tests that interrupt or kill it mid-training."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path


def start_run(workdir: Path, script: str = "train.aner") -> subprocess.Popen[str]:
    """`aner run SCRIPT` in `workdir` (its kernel cache there too), stdout and stderr piped as
    text."""
    return subprocess.Popen(
        [sys.executable, "-m", "aner_lang.cli", "run", script],
        cwd=workdir,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "ANER_CACHE_DIR": str(workdir / "cache")},
    )


def wait_for_updates(
    proc: subprocess.Popen[str], events: Path, count: int, timeout: float = 300
) -> None:
    """Return once the run's event log `events` holds `count` update events; fail if the run
    ends first (it finished too fast to be interrupted where the test means to)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and proc.poll() is None:
        if events.exists() and events.read_text().count('"event": "update"') >= count:
            break
        time.sleep(0.005)
    assert proc.poll() is None, f"the run ended before {count} updates were logged"

"""Processes the job room starts and watches: identity that survives pid reuse, liveness, and
starting a process detached from the terminal that asked for it."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Mapping, Sequence
from pathlib import Path


def identity(pid: int) -> str | None:
    """What tells process `pid` apart from a later process given the same pid: its start time
    in clock ticks since boot (field 22 of ``/proc/<pid>/stat``); None where there is no
    ``/proc`` or no such process."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    # the command name (field 2) is in parentheses and may hold spaces: split after it
    fields = stat[stat.rfind(")") + 2 :].split()
    return fields[19] if len(fields) > 19 else None


def _zombie(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat[stat.rfind(")") + 2 :].startswith("Z")


def alive(pid: int | None, token: str | None) -> bool:
    """Whether process `pid` still runs and is the one whose `identity` was `token` (a process
    that exited but was not reaped yet counts as ended)."""
    if not pid:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # it exists, under another user
        pass
    if _zombie(pid):
        return False
    return token is None or identity(pid) in (None, token)


def spawn_detached(
    argv: Sequence[str], *, env: Mapping[str, str], log: Path, cwd: Path | None = None
) -> subprocess.Popen[bytes]:
    """Start `argv` in a new session (no controlling terminal: closing the shell that ran
    `aner submit` does not stop it), stdin from /dev/null, stdout and stderr to `log`."""
    log.parent.mkdir(parents=True, exist_ok=True)
    with open(log, "ab") as out:
        return subprocess.Popen(
            list(argv),
            cwd=cwd,
            env=dict(env),
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )

"""How long this process has been running: the start-up a run reports (process start to its
first update) includes the interpreter, imports and model loading, which happen before any of
Aner's own clocks start.

On Linux the start is the kernel's (`/proc/self/stat`, in clock ticks: 10 ms at the usual
100 Hz); elsewhere it is when this module was first imported, which undercounts the start-up.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

_IMPORTED = time.monotonic()


def seconds_running() -> float:
    """Wall-clock seconds since this process started (see the module docstring)."""
    try:
        stat = Path("/proc/self/stat").read_text()
        # field 22, `starttime`; the fields after the parenthesised command name start at 3
        ticks = int(stat.rsplit(")", 1)[1].split()[19])
        uptime = float(Path("/proc/uptime").read_text().split()[0])
        return max(0.0, uptime - ticks / os.sysconf("SC_CLK_TCK"))
    except (OSError, ValueError, IndexError):
        return time.monotonic() - _IMPORTED

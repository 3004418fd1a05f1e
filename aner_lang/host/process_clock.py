"""How long this process has been running, and where its start-up went: the start-up a run
reports (process start to its first update) includes the interpreter, imports and model loading,
which happen before any of Aner's own clocks start. `timed` phases (loading a model, building
kernels) are summed per process, so a run's `start` event can say what its first seconds held
(phases may nest: kernels built during a load count in both). The phases: `checks` (`aner run`'s
checks before the script runs: its text, files and machine, and the training data against the
model's tokenizer, which imports what that needs), `imports` (the builtins' implementations
imported on first use: torch, CuPy, Triton and Aner's runtime), `load_model`, `kernel_build`,
and `train_setup` (from a `train` call to its `start` event: tokenizing the examples, checking
them, the kernels' identity).

Pure standard library: the interpreter times its imports of the runtime with it.

On Linux the start is the kernel's (`/proc/self/stat`, in clock ticks: 10 ms at the usual
100 Hz); elsewhere it is when this module was first imported, which undercounts the start-up.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

_IMPORTED = time.monotonic()
_PHASES: dict[str, float] = {}


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


@contextmanager
def timed(phase: str) -> Iterator[None]:
    """Add the enclosed block's wall seconds to this process's total for `phase`."""
    began = time.perf_counter()
    try:
        yield
    finally:
        add(phase, time.perf_counter() - began)


def add(phase: str, seconds: float) -> None:
    """Add `seconds` to this process's total for `phase` (a span no block encloses)."""
    _PHASES[phase] = _PHASES.get(phase, 0.0) + seconds


def phases() -> dict[str, float]:
    """Seconds spent so far in each `timed` phase of this process."""
    return dict(_PHASES)

"""This machine's host memory available to a run, as the kernel estimates it.

`offload` keeps every layer's input in pinned (page-locked) host memory, which cannot be swapped
out: a run whose copies outgrow the memory available is killed by the kernel, without a word.
The budget picker and the trainer ask here first. The figure is Linux's `MemAvailable` (memory
that can be given out without swapping); elsewhere, or where it cannot be read, it is unknown.
"""

from __future__ import annotations

from pathlib import Path

MEMINFO = Path("/proc/meminfo")
_READ_LIMIT = 64 << 10
"""/proc/meminfo is about 1.5 KiB; a read stops here whatever it is."""


def available_bytes(meminfo: Path = MEMINFO) -> int | None:
    """Host memory available without swapping, in bytes; None where unknown."""
    try:
        with open(meminfo, "rb") as f:
            text = f.read(_READ_LIMIT).decode("ascii", "replace")
    except OSError:
        return None
    for line in text.splitlines():
        name, _, rest = line.partition(":")
        if name == "MemAvailable":
            value, *unit = rest.split()
            if value.isdigit() and unit == ["kB"]:
                return int(value) * 1024
    return None

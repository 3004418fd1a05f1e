"""Sizes as the reports print them (the plan, `memory()`, errors about memory)."""

from __future__ import annotations


def human_bytes(n: int) -> str:
    """A byte count in the largest binary unit it reaches (B, KiB, MiB, GiB), as the plan and the
    memory report print sizes: whole bytes, one decimal of KiB and MiB, two of GiB."""
    if n < 1 << 10:
        return f"{n} B"
    if n < 1 << 20:
        return f"{n / (1 << 10):.1f} KiB"
    if n < 1 << 30:
        return f"{n / (1 << 20):.1f} MiB"
    return f"{n / (1 << 30):.2f} GiB"

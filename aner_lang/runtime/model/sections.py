"""Named sections of a training step, so a profiler can split device time by what it was for.

Off by default: `section(name)` is then one shared null context, a call and nothing more (a
`record_function` costs microseconds per use, thousands of times a step). `benchmarks/train_scale.py`
turns sections on only for the steps it profiles. Names: ``nf4_forward``, ``nf4_backward``,
``lora``, ``attention``, ``norms_activations``, ``loss``, ``optimizer``.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext

from torch.profiler import record_function

PREFIX = "aner::"
_NULL: AbstractContextManager[None] = nullcontext()
_enabled = False


def section(name: str) -> AbstractContextManager[object]:
    """A profiler range ``aner::name`` while sections are on, else nothing."""
    return record_function(PREFIX + name) if _enabled else _NULL


@contextmanager
def sections_on() -> Iterator[None]:
    """Mark the sections of the enclosed steps (for a profiler that records them)."""
    global _enabled
    before, _enabled = _enabled, True
    try:
        yield
    finally:
        _enabled = before

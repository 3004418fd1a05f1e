"""What the benchmarks' tests share: a benchmark script imported as a module."""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable
from pathlib import Path
from types import ModuleType

import pytest

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"


def _script(name: str) -> ModuleType:
    """`benchmarks/<name>.py` as a module, imported as it runs: with its folder on the path
    while it imports, for the scripts it imports in turn (train_scale, train_e2e)."""
    sys.path.insert(0, str(BENCHMARKS))
    try:
        return importlib.import_module(name)
    finally:
        sys.path.remove(str(BENCHMARKS))


@pytest.fixture(scope="session")
def bench_script() -> Callable[[str], ModuleType]:
    """Import a benchmark script by name (`bench_script("train_scale")`)."""
    return _script

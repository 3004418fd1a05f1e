"""examples/language_tour.aner runs without a model, and what it prints about its numbers is
what Python computes for them."""

from __future__ import annotations

from pathlib import Path

from aner_lang.cli import main

TOUR = Path(__file__).resolve().parents[2] / "examples" / "language_tour.aner"


def _fib(n: int) -> int:
    a, b = 0, 1
    for _ in range(n):
        a, b = b, a + b
    return a


def test_the_tour_s_fibonacci_lines_are_true(capsys) -> None:  # type: ignore[no-untyped-def]
    assert main(["run", str(TOUR)]) == 0
    lines = capsys.readouterr().out.splitlines()
    fibs = [_fib(i) for i in range(10)]
    assert f"fib: {fibs}" in lines
    assert f"sum of fib: {sum(fibs)} over {len(fibs)} values" in lines

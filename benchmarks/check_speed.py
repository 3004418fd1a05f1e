"""How fast `aner check` is on a generated 10,000-line script (target: under 1 s on 2 cores),
and proof that checking never imports torch.

Prints the parse and check times, lines per second, and the ratio against a baseline measured in
the same run: Python's own `compile()` of a script of the same shape (a floor no Python-hosted
checker beats). Run: python benchmarks/check_speed.py [lines]
"""

from __future__ import annotations

import sys
import time


def generate(lines: int) -> str:
    """A realistic script: functions with branches, calls with named arguments, interpolation,
    loops, lists and byte sizes; `lines` lines long."""
    out: list[str] = []
    i = 0
    while len(out) < lines:
        out += [
            f"fn f{i}(a: Int, b: Float = 2.0) -> Float {{",
            f"  let c = a * 2 + {i}",
            "  if c > 10 and b < 3.5 {",
            "    return b * 1.5",
            "  }",
            "  return b + 1.0",
            "}",
            f"let v{i} = f{i}({i}, b: 0.5)",
            f'let s{i} = "value ${{v{i}}} of {i}"',
            f"let xs{i} = [1, 2, 3, {i}]",
            f"for x in xs{i} {{ print(str(x + {i}) + s{i}) }}",
            f"print(512 KiB * {i} > 2 MiB)",
        ]
        i += 1
    return "\n".join(out) + "\n"


def python_equivalent(lines: int) -> str:
    out: list[str] = []
    i = 0
    while len(out) < lines:
        out += [
            f"def f{i}(a: int, b: float = 2.0) -> float:",
            f"    c = a * 2 + {i}",
            "    if c > 10 and b < 3.5:",
            "        return b * 1.5",
            "    return b + 1.0",
            f"v{i} = f{i}({i}, b=0.5)",
            f's{i} = f"value {{v{i}}} of {i}"',
            f"xs{i} = [1, 2, 3, {i}]",
            f"for x in xs{i}:",
            f"    print(str(x + {i}) + s{i})",
            f"print(512 * 1024 * {i} > 2 * 1024 * 1024)",
        ]
        i += 1
    return "\n".join(out) + "\n"


def main() -> None:
    lines = int(sys.argv[1]) if len(sys.argv) > 1 else 10_000
    source = generate(lines)
    lines = source.count("\n")
    t0 = time.perf_counter()
    from aner_lang.check import analyze
    from aner_lang.grammar import parse

    parse("let warm = 1\n")  # build the parser once (cold start is reported separately)
    t1 = time.perf_counter()
    best_parse = best_check = best_cpu = float("inf")
    for _ in range(3):
        s = time.perf_counter()
        parse(source)
        m = time.perf_counter()
        c = time.process_time()
        analysis = analyze(source, "bench.aner")
        e = time.perf_counter()
        best_cpu = min(best_cpu, time.process_time() - c)
        best_parse, best_check = min(best_parse, m - s), min(best_check, e - m)
    assert not analysis.errors, analysis.errors[:3]
    py = python_equivalent(lines)
    best_py = float("inf")
    for _ in range(3):
        s = time.perf_counter()
        compile(py, "bench.py", "exec")
        best_py = min(best_py, time.perf_counter() - s)
    print(f"lines: {lines}")
    print(f"import + parser build: {t1 - t0:.3f} s")
    print(f"parse only: {best_parse:.3f} s")
    print(
        f"aner check (parse + check): {best_check:.3f} s  ({lines / best_check:,.0f} lines/s)"
        f"  target < 1 s: {'PASS' if best_check < 1.0 else 'FAIL'}"
    )
    print(
        f"aner check CPU time (what the process itself used; wall time suffers on a busy box): "
        f"{best_cpu:.3f} s"
    )
    print(
        f"baseline python compile(): {best_py:.3f} s  ratio aner/python: {best_check / best_py:.1f}x"
    )
    print(f"torch imported: {'torch' in sys.modules}")


if __name__ == "__main__":
    main()

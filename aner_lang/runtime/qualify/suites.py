"""The repository's test suites, run and counted: one pytest run per room, like the reference's
one binary per unit suite. Each suite's counts come from pytest's JUnit XML, and its log's sha256
is recorded. Suites run from a source checkout (where ``tests/`` is); an installed package has
none, and the report says so."""

from __future__ import annotations

import hashlib
import importlib.util
import subprocess
import sys
import time
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

import aner_lang

ROOT = Path(aner_lang.__file__).resolve().parents[1]
SUITES = (
    ("language", "tests/lang"),
    ("testing", "tests/testing"),
    ("io", "tests/runtime/io"),
    ("load", "tests/runtime/load"),
    ("model", "tests/runtime/model"),
    ("nf4", "tests/runtime/nf4"),
    ("adapters", "tests/runtime/adapters"),
    ("tasks", "tests/runtime/tasks"),
    ("training", "tests/runtime/train"),
    ("export", "tests/runtime/export"),
    ("jobs", "tests/runtime/jobs"),
    ("services", "tests/runtime/services"),
    ("qualify", "tests/runtime/qualify"),
    ("gguf blocks", "tests/runtime/ggml"),
    ("hostile files", "tests/runtime/test_hostile_files.py"),
    ("hostile JSON", "tests/runtime/test_hostile_json.py"),
    ("output kinds", "tests/runtime/test_output_kinds.py"),
    ("printed values", "tests/runtime/test_printed_values.py"),
    ("run prechecks", "tests/runtime/test_run_prechecks.py"),
    ("benchmarks", "tests/benchmarks"),
    ("adversarial", "tests/adversarial"),
    ("lsp", "lsp/tests"),
)


def _counts(junit: Path) -> dict[str, int]:
    totals = {"tests": 0, "failures": 0, "errors": 0, "skipped": 0}
    root = ET.parse(junit).getroot()
    for suite in root.iter("testsuite"):
        for key in totals:
            totals[key] += int(suite.get(key, 0))
    return totals


def run_suites(
    workdir: Path, workers: int = 0, seconds_each: float | None = None
) -> list[dict[str, Any]]:
    """Every suite of `SUITES` that exists here, run with pytest (in `workers` processes when
    pytest-xdist is installed and `workers` > 1). A suite still running after `seconds_each` is
    stopped and reported as ``timeout`` with what its JUnit file holds (nothing, usually): one
    hung suite costs its own counts, not the whole report."""
    if not (ROOT / "tests").is_dir():
        return [{"skipped": f"no test suites at {ROOT} (not a source checkout)"}]
    parallel = workers > 1 and importlib.util.find_spec("xdist") is not None
    results = []
    for name, path in SUITES:
        if not (ROOT / path).exists():
            continue
        junit, log = workdir / f"{name}.xml", workdir / f"{name}.log"
        argv = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", path]
        argv += [f"--junitxml={junit}"] + (["-n", str(workers)] if parallel else [])
        start = time.perf_counter()
        with open(log, "wb") as out:
            try:
                code: int | None = subprocess.run(
                    argv, cwd=ROOT, stdout=out, stderr=subprocess.STDOUT, timeout=seconds_each
                ).returncode
            except subprocess.TimeoutExpired:
                code = None
        seconds = time.perf_counter() - start
        counts = _counts(junit) if junit.is_file() else {}
        passed = counts.get("tests", 0) - sum(
            counts.get(k, 0) for k in ("failures", "errors", "skipped")
        )
        results.append(
            {
                "name": name,
                "status": "timeout" if code is None else "pass" if code == 0 else "fail",
                "checks": passed,
                "failed": counts.get("failures", 0) + counts.get("errors", 0),
                "skipped": counts.get("skipped", 0),
                "source_dir": path,
                "seconds": seconds,
                "log_sha256": hashlib.sha256(log.read_bytes()).hexdigest(),
            }
        )
    return results

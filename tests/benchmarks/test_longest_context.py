"""benchmarks/longest_context.py: the search finds the boundary to the resolution, failures are
told apart, the plan's longest context is ordered as memory is, and the whole run (one process
per attempt, Aner's own budget picker deciding) agrees with the plan on the CPU."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def lc(bench_script: Callable[[str], ModuleType]) -> ModuleType:
    return bench_script("longest_context")


def _probe(boundary: int, tried: list[int]):  # type: ignore[no-untyped-def]
    def attempt(context: int) -> bool:
        tried.append(context)
        return context <= boundary

    return attempt


def test_search_finds_every_boundary_to_the_resolution(lc: ModuleType) -> None:
    start, most, step = 8192, 524288, 1024
    for boundary in range(start, most, 4099):  # boundaries on and between the probed contexts
        tried: list[int] = []
        found = lc.search(_probe(boundary, tried), start, most, step)
        expected = start + (boundary - start) // step * step
        assert found == lc.Found(expected, expected + step, True), boundary
        assert all((c - start) % step == 0 for c in tried)
        assert len(tried) == len(set(tried))  # no context probed twice
        doubled = tried.index(next(c for c in tried if c > boundary)) + 1  # to the first failure
        assert tried[:doubled] == [start << k for k in range(doubled)], tried


def test_search_edges(lc: ModuleType) -> None:
    tried: list[int] = []
    assert lc.search(_probe(100, tried), 8192, 65536, 1024) == lc.Found(None, 8192, True)
    assert tried == [8192]  # a failure at the start: nothing shorter is tried
    tried = []
    assert lc.search(_probe(10**9, tried), 8192, 50000, 1024) == lc.Found(50000, None, True)
    assert tried == [8192, 16384, 32768, 50000]  # the last doubling is cut to --max
    runs = iter([True, True, False, None])  # out of time during the bisection
    assert lc.search(lambda c: next(runs), 1024, 65536, 256) == lc.Found(2048, 4096, False)
    runs = iter([True, None])  # out of time while doubling
    assert lc.search(lambda c: next(runs), 1024, 65536, 256) == lc.Found(1024, None, False)


@pytest.mark.parametrize(
    ("text", "timed_out", "signal", "kind"),
    [
        (
            "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB",
            False,
            None,
            "oom",
        ),
        (
            "RuntimeError: CUDA error: out of memory\nCUDA kernel errors might be",
            False,
            None,
            "oom",
        ),
        (
            "error[E-PROFILE-BUDGET]: profile: memory_budget 24 GiB is less than",
            False,
            None,
            "budget",
        ),
        ("torch.OutOfMemoryError: CUDA out of memory", True, None, "timeout"),
        ("", True, None, "timeout"),
        ("ModuleNotFoundError: No module named 'unsloth'", False, None, "error"),
        ("Unsloth 2026.10.9 patched 32 layers", False, 9, "killed"),  # the host's OOM killer
        ("Segmentation fault", False, 11, "error"),
    ],
)
def test_classify(
    lc: ModuleType, text: str, timed_out: bool, signal: int | None, kind: str
) -> None:
    assert lc.classify(text, timed_out, signal) == kind


def test_host_low_keeps_the_least_memory_available(
    lc: ModuleType, monkeypatch: pytest.MonkeyPatch
) -> None:
    readings = iter([9, 7, 3, 8, None, 5])
    monkeypatch.setattr(lc, "available_bytes", lambda: next(readings, 6))
    with lc.HostLow(every=0.001) as host:
        time.sleep(0.05)
    assert host.lowest == 3


def test_an_attempt_killed_from_outside_says_so(
    lc: ModuleType, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """A SIGKILLed worker (the host's out-of-memory killer leaves no message) is `killed`, with
    the host's low point beside it."""
    killed = subprocess.CompletedProcess([], -9, stdout="Unsloth: patched 32 layers\n", stderr="")
    monkeypatch.setattr(lc.subprocess, "run", lambda *a, **k: killed)
    monkeypatch.setattr(lc, "available_bytes", lambda: 2**30)
    row = lc.run_attempt("unsloth-gc", {"dir": str(tmp_path), "device": "cpu"}, 10)
    assert row["kind"] == "killed" and not row["ok"]
    assert row["tail"].startswith("killed by signal 9") and row["host_available_low_bytes"] == 2**30
    line = lc.summary({**row, "side": "unsloth-gc", "cap_gib": 80.0, "context": 327680})
    assert "killed after" in line and "host memory available fell to 1.1 GB" in line


def test_planned_longest_orders_caps_and_policies(lc: ModuleType) -> None:
    config = lc.plan_config("tiny")
    # MiB around the tiny shape's planned peaks (on CUDA ~97 MiB are its kernels' workspaces)
    for cuda, mib in ((False, (10, 12, 16, 20, 40, 400)), (True, (98, 100, 104, 110, 125, 400))):
        caps = [int(m * 2**20) for m in mib]
        planned = lc.planned_longest(config, caps, 4096, 64, cuda)
        for policy, by_cap in planned.items():
            found = [by_cap[c] or 0 for c in caps]
            assert found == sorted(found), (policy, found)  # a bigger cap is never shorter
            for cap, context in by_cap.items():  # the longest fits, the next one does not
                if context is not None and context < 4096:
                    assert lc.planned_peak(config, policy, context, cuda) <= cap
                    assert lc.planned_peak(config, policy, context + 64, cuda) > cap
        for cap in caps:
            keep, checkpoint, offload = (planned[p][cap] or 0 for p in lc.POLICIES)
            assert offload >= checkpoint >= keep, cap
        # the caps cross the policies' boundaries: not every ordering above is an equality
        assert any((planned["offload"][c] or 0) > (planned["keep"][c] or 0) for c in caps)
        assert planned["keep"][caps[-1]] == 4096
    # the 8B shape: the planner, not a figure here, says offload reaches further than keep
    big = lc.planned_longest(lc.plan_config("llama3-8b"), [24 << 30], 131072, 1024)
    assert big["offload"][24 << 30] > big["checkpoint"][24 << 30] > big["keep"][24 << 30] > 0


@pytest.mark.slow
def test_dry_run_measures_what_the_budget_picker_allows(tmp_path: Path, lc: ModuleType) -> None:
    proc = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "longest_context.py"), "--dry-run",
         "--caps", "0.012", "--out", str(tmp_path)],
        capture_output=True, text=True, timeout=600, cwd=ROOT,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    report = json.loads((tmp_path / "longest_context.json").read_text())
    (row,) = report["longest"]
    attempts = report["attempts"]
    assert row["side"] == "aner" and row["complete"]
    assert {a["kind"] for a in attempts if not a["ok"]} == {"budget"}
    assert all(a["tokens_per_s"] > 0 and a["policy"] in lc.POLICIES for a in attempts if a["ok"])
    assert row["failed_at"] - row["longest"] == report["resolution"]
    # the trainer's own picker trained exactly as far as the plan's most frugal policy allows
    assert row["longest"] == max(v["0.012"] or 0 for v in report["planned"].values())
    at = next(a for a in attempts if a["context"] == row["longest"])
    assert at["memory_budget"]["activations"] == row["policy"] == at["policy"]
    assert at["memory_budget"]["planned_peaks"][row["policy"]] <= at["budget_bytes"]
    assert f"| aner | 0.012 | {row['longest']:,} |" in proc.stdout
    if lc.available_bytes() is not None:  # Linux: every attempt saw the host's memory
        assert all(0 < a["host_available_low_bytes"] for a in attempts)


@pytest.mark.cuda
@pytest.mark.slow
def test_a_cap_stops_torch_allocations_on_the_gpu(tmp_path: Path) -> None:
    """The tiny shape under a 0.1 GiB cap: keeping every activation runs out of the capped
    allocator (not of the card) and nothing measured passes the cap."""
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    proc = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "longest_context.py"), "--shape", "tiny",
         "--caps", "0.1", "--sides", "aner-keep,aner", "--start", "4096", "--max", "1048576",
         "--resolution", "4096", "--out", str(tmp_path)],
        capture_output=True, text=True, timeout=900, cwd=ROOT,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    report = json.loads((tmp_path / "longest_context.json").read_text())
    rows = {r["side"]: r for r in report["longest"]}
    assert rows["aner-keep"]["failure"] == "oom" and rows["aner-keep"]["longest"]
    assert rows["aner"]["failure"] in ("oom", "budget")
    for a in report["attempts"]:
        if a["ok"]:
            assert a["peak_cuda_bytes"] <= 0.1 * 2**30, a

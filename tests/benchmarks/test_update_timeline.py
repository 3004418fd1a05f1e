"""benchmarks/update_timeline.py's reading of a profiler trace: each interval from one step
replay to the next, the device's busy time in it, and its idle gaps (the wait before the next
update's first kernel included) with the host ranges that overlap each."""

from __future__ import annotations

from collections.abc import Callable
from types import ModuleType
from typing import Any

import pytest


@pytest.fixture(scope="module")
def timeline(bench_script: Callable[[str], ModuleType]) -> ModuleType:
    return bench_script("update_timeline")


def _event(cat: str, name: str, ts: float, dur: float) -> dict[str, Any]:
    return {"ph": "X", "cat": cat, "name": name, "ts": ts, "dur": dur}


def test_intervals_busy_time_and_gaps_with_the_host_work_beside_them(timeline: ModuleType):
    trace = {
        "traceEvents": [
            _event("cuda_runtime", "cudaGraphLaunch", 0, 5),
            _event("kernel", "gemm", 10, 100),
            _event("kernel", "norm", 60, 20),  # overlaps the GEMM (another stream)
            _event("gpu_memcpy", "HtoD", 200, 50),
            _event("user_annotation", "host::_Loop._zero_grads", 100, 150),
            _event("cuda_runtime", "cudaGraphLaunch", 300, 5),
            _event("kernel", "gemm", 320, 100),
            _event("user_annotation", "host::_Loop._window", 250, 60),
            _event("cuda_runtime", "cudaGraphLaunch", 500, 5),
            _event("kernel", "gemm", 510, 10),
            _event("cpu_op", "aten::mm", 0, 1000),  # an op, not a range: not named
        ]
    }
    first, second = timeline.analyse(trace, gap_us=30)
    # from the first kernel after a launch (10) to the first after the next (320)
    assert (first["wall_us"], first["busy_us"], first["idle_us"]) == (310, 150, 160)
    assert first["gaps"] == [  # the largest first, each where it began in the interval
        {"at_us": 100, "idle_us": 90, "host": {"host::_Loop._zero_grads": 90.0}},
        {
            "at_us": 240,
            "idle_us": 70,
            "host": {"host::_Loop._window": 60.0, "cudaGraphLaunch": 5.0},
        },
    ]
    assert (second["wall_us"], second["busy_us"]) == (190, 100)
    assert [g["idle_us"] for g in second["gaps"]] == [90]  # 420 to 510: the wait for the next
    assert timeline.analyse(trace, gap_us=95)[0]["gaps"] == []

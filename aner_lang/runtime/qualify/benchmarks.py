"""Component benchmarks: one NF4 linear (x @ W^T) at the reference's shapes, through each kernel
path this machine has, warm and synchronized, median of five calls (upload and JIT excluded)."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from typing import Any

import torch

from aner_lang.runtime.nf4.backends import HostTiled, get_backend
from aner_lang.runtime.nf4.fused.availability import unavailable_reason
from aner_lang.runtime.nf4.quant import quantize_nf4

SHAPES = ((576, 576, 32), (1536, 576, 32), (49152, 576, 32), (4096, 4096, 128))
"""(rows = out features, columns = in features, tokens): SmolLM2's q/o, MLP and vocabulary, and a
Llama-7B square, as in the reference report."""
ITERATIONS = 5


def _median_seconds(call: Callable[[], object], device: torch.device) -> float:
    def sync() -> None:
        if device.type == "cuda":
            torch.cuda.synchronize(device)

    call()  # warm-up: allocation, JIT, caches
    sync()
    times = []
    for _ in range(ITERATIONS):
        start = time.perf_counter()
        call()
        sync()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def _shape(rows: int, cols: int, tokens: int, device: torch.device, gen: Any) -> dict[str, Any]:
    w = quantize_nf4(torch.randn(rows, cols, generator=gen) * 0.02).to(device)
    x = torch.randn(tokens, cols, generator=gen).to(device)
    tiled = HostTiled()
    row: dict[str, Any] = {
        "event": "nf4_linear_benchmark",
        "device": str(device),
        "rows": rows,
        "columns": cols,
        "tokens": tokens,
        "iterations": ITERATIONS,
        "host_tiled_fp32_median_seconds": _median_seconds(lambda: tiled.linear(x, w), device),
        "packed_bytes": w.packed_nbytes(),
        "dense_float32_bytes": 4 * rows * cols,
    }
    reason = unavailable_reason()
    if reason is None:
        fused, half = get_backend("fused"), x.half()
        row["fused_fp32_median_seconds"] = _median_seconds(lambda: fused.linear(x, w), device)
        row["fused_fp16_median_seconds"] = _median_seconds(lambda: fused.linear(half, w), device)
    else:
        row["fused"] = f"skipped: {reason}"
    row["scope"] = "warm synchronized linear calls; excludes upload and JIT"
    return row


def nf4_linear() -> list[dict[str, Any]]:
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    gen = torch.Generator().manual_seed(0)
    return [_shape(rows, cols, tokens, device, gen) for rows, cols, tokens in SHAPES]

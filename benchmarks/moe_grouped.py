"""One MoE projection's expert products: `experts.grouped_mm` (torch's grouped GEMM) against a
matmul per expert, on the GPU, plus which dtypes and memory orders the grouped kernel takes there.

Usage: python benchmarks/moe_grouped.py [--out FILE]   (a CUDA GPU; prints and writes JSON)
Shape: Qwen3-30B-A3B's experts (128 of 768x2048), 2048 tokens routed to 8 each (16 rows each).
"""

from __future__ import annotations

import argparse
import json
import time

import torch

from aner_lang.runtime.model.experts import grouped_mm


def _support(device: torch.device) -> dict[str, str]:
    """Per dtype and memory order of b: does `torch._grouped_mm` run forward and backward, and
    how far is it from a matmul per group."""
    out = {}
    for dtype in (torch.bfloat16, torch.float16, torch.float32):
        for transposed in (False, True):
            key = f"{str(dtype).removeprefix('torch.')}/{'transposed' if transposed else 'plain'}"
            a = torch.randn(100, 64, device=device, dtype=dtype, requires_grad=True)
            shape = (4, 32, 64) if transposed else (4, 64, 32)
            w = torch.randn(*shape, device=device, dtype=dtype, requires_grad=True)
            b = w.transpose(1, 2) if transposed else w
            offs = torch.tensor([10, 10, 60, 100], device=device, dtype=torch.int32)
            try:
                y = torch._grouped_mm(a, b, offs=offs)
                y.backward(torch.ones_like(y))
            except RuntimeError as e:
                out[key] = f"refused: {str(e)[:120]}"
                continue
            want = torch.cat([a[:10] @ b[0], a[10:60] @ b[2], a[60:] @ b[3]])
            out[key] = f"runs, max difference {(y - want).abs().max().item():.3g}"
    return out


def _time(fn: object, repeats: int) -> float:
    for _ in range(3):
        fn()  # type: ignore[operator]
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(repeats):
        fn()  # type: ignore[operator]
    torch.cuda.synchronize()
    return (time.perf_counter() - start) / repeats


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out")
    args = parser.parse_args()
    device = torch.device("cuda")
    experts, n, k, rows = 128, 768, 2048, 2048 * 8
    x = torch.randn(rows, k, device=device, dtype=torch.bfloat16)
    w = torch.randn(experts, n, k, device=device, dtype=torch.bfloat16)
    offs = torch.full((experts,), rows // experts, device=device).cumsum(0).to(torch.int32)
    step = rows // experts
    grouped = _time(lambda: grouped_mm(x, w.transpose(1, 2), offs), 20)
    looped = _time(lambda: [x[e * step : (e + 1) * step] @ w[e].t() for e in range(experts)], 5)
    flops = 2 * rows * n * k
    report = {
        "device": torch.cuda.get_device_name(),
        "torch": torch.__version__,
        "support": _support(device),
        "shape": {"experts": experts, "out": n, "in": k, "rows": rows},
        "grouped_ms": grouped * 1e3,
        "grouped_tflops": flops / grouped / 1e12,
        "matmul_per_expert_ms": looped * 1e3,
    }
    print(json.dumps(report, indent=1))
    if args.out:
        with open(args.out, "w") as f:
            json.dump(report, f, indent=1)


if __name__ == "__main__":
    main()

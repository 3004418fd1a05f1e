"""host_tiled NF4 matmul throughput on this CPU against a dense fp32 matmul, same run.

    python benchmarks/host_tiled.py [--repeats N]

Shapes are the reference qualification's (576x576, 1536x576, 49152x576 at 32 tokens; 4096x4096 at
128 tokens). The dense baseline multiplies by the already-dequantized weight, so the ratio is the
cost of keeping the weight 4-bit (8x less memory than fp32) and dequantizing tiles on the fly.
"""

from __future__ import annotations

import argparse
import json
import time

import torch

from aner_lang.runtime.nf4 import host_tiled
from aner_lang.runtime.nf4.quant import dequantize_nf4, quantize_nf4

SHAPES = [(576, 576, 32), (1536, 576, 32), (49152, 576, 32), (4096, 4096, 128)]


def _best_of(fn, repeats: int) -> float:
    fn()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return min(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    torch.manual_seed(0)
    rows = []
    for n, k, m in SHAPES:
        w = quantize_nf4(torch.randn(n, k) * 0.02)
        dense = dequantize_nf4(w)
        x = torch.randn(m, k)
        t_nf4 = _best_of(lambda x=x, w=w: host_tiled.linear(x, w), args.repeats)
        t_dense = _best_of(lambda x=x, dense=dense: x @ dense.t(), args.repeats)
        gflops = 2 * m * n * k / t_nf4 / 1e9
        rows.append(
            {
                "shape": f"{n}x{k}",
                "tokens": m,
                "host_tiled_ms": t_nf4 * 1e3,
                "dense_fp32_ms": t_dense * 1e3,
                "slowdown_vs_dense": t_nf4 / t_dense,
                "host_tiled_gflops": gflops,
                "weight_bytes_nf4": w.packed_nbytes(),
                "weight_bytes_fp32": 4 * n * k,
            }
        )
        print(
            f"{n:>6}x{k:<5} m={m:<4} host_tiled {t_nf4 * 1e3:8.2f} ms  dense fp32 "
            f"{t_dense * 1e3:8.2f} ms  ratio {t_nf4 / t_dense:5.2f}x  ({gflops:6.1f} GFLOP/s, "
            f"weights {4 * n * k / w.packed_nbytes():.1f}x smaller)"
        )
    print(json.dumps({"threads": torch.get_num_threads(), "results": rows}))


if __name__ == "__main__":
    main()

"""Fused NF4 linear vs dense bf16 torch matmul vs bitsandbytes matmul_4bit, all in one run.

Run on a CUDA machine (``python benchmarks/nf4_kernels.py --out results.json``). For every shape
(out x in features, tokens) it times forward in bfloat16 for: ours (the path ``ops.path`` names),
(a) dense bf16 ``F.linear``, (b) bitsandbytes ``matmul_4bit`` on the same NF4 double-quant weight,
and prints the ratios with achieved HBM GB/s (weight + activations, each read or written once)
and TFLOP/s beside each. Small shapes are launch-bound, so each method is captured in a CUDA graph
of back-to-back calls over enough weight copies to exceed the L2 cache (no cache-resident
flattery), and the graph's replays are timed with CUDA events (median).
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import torch

SEED_SHAPES = [(576, 576, 32), (1536, 576, 32), (49152, 576, 32), (4096, 4096, 128)]
SWEEP = [(n, k, m) for n, k in ((4096, 4096), (4096, 14336)) for m in (1, 16, 512, 4096)] + [
    (14336, 4096, 32),
    (14336, 4096, 128),
    (49152, 576, 128),
    (4096, 4096, 1024),
]  # fused GEMM shapes
L2_FLUSH_BYTES = 200 * 2**20


def time_graph(calls: list[Callable[[], object]], replays: int = 20) -> float:
    """Median microseconds per call of a CUDA graph holding ``calls`` back to back."""
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for c in calls[:2]:
            c()  # warm-up: compile, load, allocate outside the capture
    torch.cuda.current_stream().wait_stream(s)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for c in calls:
            c()
    _warm(graph.replay)
    times = []
    for _ in range(replays):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        graph.replay()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b) * 1000.0 / len(calls))
    return statistics.median(times)


def _warm(run: Callable[[], object], seconds: float = 0.02) -> None:
    """Run the timed work back to back for a while before timing it (it used to run twice)."""
    end = time.perf_counter() + seconds
    while True:
        run()
        torch.cuda.synchronize()
        if time.perf_counter() >= end:
            return


def time_loop(calls: list[Callable[[], object]], reps: int = 5) -> float:
    """Fallback for code a graph cannot capture: back-to-back launches, events around them."""
    _warm(lambda: [c() for c in calls])
    times = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        for c in calls:
            c()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b) * 1000.0 / len(calls))
    return statistics.median(times)


def measure(calls: list[Callable[[], object]]) -> tuple[float, str]:
    try:
        return time_graph(calls), "graph"
    except Exception:
        torch.cuda.synchronize()
        return time_loop(calls), "loop"


def ceilings() -> dict[str, float]:
    """Copy bandwidth and dense bf16 matmul rate measured now: the figures to compare against."""
    a = torch.empty(2**30, dtype=torch.uint8, device="cuda")
    b = torch.empty_like(a)
    us, _ = measure([lambda: b.copy_(a)] * 5)
    x = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    mm_us, _ = measure([lambda: x @ x] * 3)
    return {"copy_GBps": 2 * a.numel() / us / 1e3, "bf16_matmul_TFLOPs": 2 * 8192**3 / mm_us / 1e6}


def bench_shape(n: int, k: int, m: int, dtype: torch.dtype) -> dict:
    import bitsandbytes as bnb
    import bitsandbytes.functional as bnbf

    from aner_lang.runtime.nf4.fused import ops

    w = torch.randn(n, k, device="cuda", dtype=torch.float32) * 0.05
    packed, state = bnbf.quantize_4bit(w, blocksize=64, compress_statistics=True, quant_type="nf4")
    state.dtype = dtype
    nf4 = ops.NF4Tensors(
        packed.reshape(-1),
        state.absmax.reshape(-1),
        state.state2.code.float(),
        state.state2.absmax.float(),
        state.offset.reshape(1).float(),
        n,
        k,
    )
    dense = w.to(dtype)
    del w
    nf4_bytes = packed.numel() + state.absmax.numel() + 4 * state.state2.absmax.numel()
    act_bytes = (m * k + m * n) * dense.element_size()
    x = torch.randn(m, k, device="cuda", dtype=dtype)
    # Rotate weight copies so one graph pass touches more than the L2 holds.
    c_nf4 = max(1, min(32, math.ceil(L2_FLUSH_BYTES / nf4_bytes)))
    c_dense = max(1, min(32, math.ceil(L2_FLUSH_BYTES / (2 * n * k))))
    nf4s = [nf4] + [
        ops.NF4Tensors(
            nf4.packed.clone(),
            nf4.qabsmax.clone(),
            nf4.code2,
            nf4.absmax2.clone(),
            nf4.offset,
            n,
            k,
        )
        for _ in range(c_nf4 - 1)
    ]
    denses = [dense] + [dense.clone() for _ in range(c_dense - 1)]
    packs = [packed] + [packed.clone() for _ in range(c_nf4 - 1)]
    flops = 2.0 * m * n * k

    def row(us: float, weight_bytes: int, how: str) -> dict:
        return {
            "us": us,
            "GBps": (weight_bytes + act_bytes) / us / 1e3,
            "TFLOPs": flops / us / 1e6,
            "timed": how,
        }

    # ops.linear picks its path at each call, so forced_path below retargets these same calls.
    ours_calls = [lambda t=t: ops.linear(x, t) for t in nf4s]
    with torch.no_grad():
        # The GPU needs a while to settle after the previous (possibly heavy) shape: on the H200 the
        # first method timed on 14336x4096 at 32 tokens, right after 4096x14336 at 4096 tokens, read
        # 10-13% slow for about 60 ms (50.6, then 46.9, 45.2, 44.5 us for the same kernel; 2026-12-03).
        _warm(lambda: [c() for c in ours_calls], seconds=0.2)
        ours = row(*_pair(measure(ours_calls), nf4_bytes))
        dense_r = row(
            *_pair(
                measure([lambda d=d: torch.nn.functional.linear(x, d) for d in denses]), 2 * n * k
            )
        )
        bnb_r = row(
            *_pair(
                measure([lambda p=p: bnb.matmul_4bit(x, p.t(), quant_state=state) for p in packs]),
                nf4_bytes,
            )
        )
        ref = x.double() @ bnbf.dequantize_4bit(packed, state).double().T
        dequant_cublas = None
        tiles: dict[str, float] = {}
        if (
            m > ops.SMALL_MAX_TOKENS and ops._module(x.device).has_wgmma
        ):  # every fused tile, and the unfused path
            for kind, choices in (
                ("wgmma", ops.WGMMA_TILES),
                ("ws", ops.WS_TILES),
                ("tma", ops.TMA_KERNELS),
            ):
                for tile in choices:
                    with forced_path(ops, kind, tile):
                        name = "t{}r{}k{}".format(*tile) if kind == "tma" else tile
                        tiles[f"{kind}{name}"] = measure(ours_calls)[0]
            with forced_path(ops, "dequant", 0):
                dequant_cublas = row(*_pair(measure(ours_calls), nf4_bytes))
        err = rel_err(ops.linear(x, nf4), ref)
        err_f32_out = rel_err(ops.linear(x, nf4, out_dtype=torch.float32), ref)
    return {
        "out_features": n,
        "in_features": k,
        "tokens": m,
        "dtype": str(dtype).removeprefix("torch."),
        "path": ops.path(m, dtype, x.device, n, k),
        "ours": ours,
        "ours_dequant_cublas": dequant_cublas,
        "fused_tiles_us": tiles,
        "rel_err_fp32_out_vs_fp64": err_f32_out,
        "dense_bf16": dense_r,
        "bnb_matmul_4bit": bnb_r,
        "ours_vs_dense": ours["us"] / dense_r["us"],
        "ours_vs_bnb": ours["us"] / bnb_r["us"],
        "rel_err_vs_fp64": err,
        "weight_copies": c_nf4,
    }


@contextmanager
def forced_path(ops, kind: str, tile: int | tuple[int, int, int]) -> Iterator[None]:
    """``ops.linear`` on one many-token path whatever the shape rules say: "wgmma" or "ws" (the
    warp-specialized GEMM) with ``tile`` tokens per block, "tma" with the block shape ``tile``
    (tokens, weight rows, k-splits), or "dequant" (dequantize + cuBLAS)."""
    saved = {
        a: getattr(ops, a)
        for a in ("_uses_wgmma", "_uses_ws", "_uses_tma", "wgmma_tile", "ws_tile", "tma_kernel")
    }
    ops._uses_wgmma = lambda *_: kind == "wgmma"
    ops._uses_ws = lambda *_: kind == "ws"
    ops._uses_tma = lambda *_: kind == "tma"
    ops.wgmma_tile = ops.ws_tile = ops.tma_kernel = lambda *_: tile
    try:
        yield
    finally:
        for a, v in saved.items():
            setattr(ops, a, v)


def rel_err(out: torch.Tensor, ref: torch.Tensor) -> float:
    return ((out.double() - ref).norm() / ref.norm()).item()


def _pair(t: tuple[float, str], nbytes: int) -> tuple[float, int, str]:
    return t[0], nbytes, t[1]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", help="write the results JSON here")
    ap.add_argument("--quick", action="store_true", help="seed shapes only")
    args = ap.parse_args()
    from aner_lang.runtime.nf4.fused import compiler

    dev = torch.cuda.current_device()
    result = {
        "device": torch.cuda.get_device_name(dev),
        "torch": torch.__version__,
        "kernel_identity": compiler.kernel_identity(compiler.load(dev).arch, "bfloat16"),
        "ceilings": ceilings(),
        "shapes": [],
    }
    print(
        f"{result['device']}  copy {result['ceilings']['copy_GBps']:.0f} GB/s  "
        f"bf16 matmul {result['ceilings']['bf16_matmul_TFLOPs']:.0f} TFLOP/s"
    )
    shapes = SEED_SHAPES + ([] if args.quick else SWEEP)
    hdr = (
        f"{'shape':>18} {'M':>5} {'path':>15} | {'ours us':>8} {'GB/s':>6} {'TF/s':>6} | {'dense us':>8} {'GB/s':>6} "
        f"{'TF/s':>6} | {'bnb us':>8} {'GB/s':>6} | {'vs dense':>8} {'vs bnb':>7} {'err':>8}"
    )
    print(hdr)
    for n, k, m in shapes:
        r = bench_shape(n, k, m, torch.bfloat16)
        result["shapes"].append(r)
        o, d, b = r["ours"], r["dense_bf16"], r["bnb_matmul_4bit"]
        print(
            f"{f'{n}x{k}':>18} {m:>5} {r['path']:>15} | {o['us']:8.2f} {o['GBps']:6.0f} {o['TFLOPs']:6.1f} | "
            f"{d['us']:8.2f} {d['GBps']:6.0f} {d['TFLOPs']:6.1f} | {b['us']:8.2f} {b['GBps']:6.0f} | "
            f"{r['ours_vs_dense']:8.2f} {r['ours_vs_bnb']:7.2f} {r['rel_err_vs_fp64']:8.1e}"
            + (
                f"  dequant+cublas {r['ours_dequant_cublas']['us']:.2f} us"
                if r["ours_dequant_cublas"]
                else ""
            )
            + "".join(f"  {t}:{us:.2f}" for t, us in r["fused_tiles_us"].items()),
            flush=True,
        )
        torch.cuda.empty_cache()
    if args.out:
        with open(args.out, "w", encoding="utf-8") as fh:
            json.dump(result, fh, indent=1)


if __name__ == "__main__":
    main()

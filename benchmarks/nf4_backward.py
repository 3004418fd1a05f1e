"""NF4 backward to the input as training runs it, vs bitsandbytes' and a dense bf16 one, one run.

QLoRA training needs dL/dx = g @ W through every frozen NF4 weight. Aner's trainer keeps that
product in fp32 (the fp32 gradient of the residual stream times the exactly dequantized weight),
which cuBLAS runs as an fp32 SIMT GEMM; PEFT + bitsandbytes (`MatMul4Bit.backward`) runs it in
the autocast dtype on tensor cores. This prints, per shape and token count, the time of:
ours as trained (fp32 gradient), ours on a bf16 gradient (the tensor-core path the trainer does
not take), bitsandbytes' backward product (dequantize_4bit, then the bf16 matmul), and a dense
bf16 matmul, with the ratios to bitsandbytes. Needs CUDA and bitsandbytes.

    python benchmarks/nf4_backward.py [--out results.json]
"""

from __future__ import annotations

import argparse
import json
import math

import torch
from nf4_kernels import L2_FLUSH_BYTES, measure

SHAPES = [
    (n, k, m)
    for n, k in ((576, 576), (1536, 576), (4096, 4096), (4096, 14336), (14336, 4096))
    for m in (512, 2048, 4096)
]


def bench_shape(n: int, k: int, m: int) -> dict:
    import bitsandbytes.functional as bnbf

    from aner_lang.runtime.nf4.fused import ops

    w = torch.randn(n, k, device="cuda") * 0.05
    packed, state = bnbf.quantize_4bit(w, blocksize=64, compress_statistics=True, quant_type="nf4")
    state.dtype = torch.bfloat16
    nf4 = ops.NF4Tensors(
        packed.reshape(-1),
        state.absmax.reshape(-1),
        state.state2.code.float(),
        state.state2.absmax.float(),
        state.offset.reshape(1).float(),
        n,
        k,
    )
    copies = max(1, min(16, math.ceil(L2_FLUSH_BYTES / (2 * n * k))))
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
        for _ in range(copies - 1)
    ]
    packs = [packed] + [t.packed.view(packed.shape) for t in nf4s[1:]]
    denses = [w.to(torch.bfloat16)] + [w.to(torch.bfloat16) for _ in range(copies - 1)]
    del w
    g32 = torch.randn(m, n, device="cuda")
    g16 = g32.to(torch.bfloat16)
    flops = 2.0 * m * n * k
    with torch.no_grad():
        times = {
            "ours_fp32_grad": measure([lambda t=t: ops.grad_input(g32, t) for t in nf4s])[0],
            "ours_bf16_grad": measure(
                [lambda t=t: ops.grad_input(g16, t, out_dtype=torch.float32) for t in nf4s]
            )[0],
            "bnb": measure([lambda p=p: g16 @ bnbf.dequantize_4bit(p, state) for p in packs])[0],
            "dense_bf16": measure([lambda d=d: g16 @ d for d in denses])[0],
        }
    return {
        "out_features": n,
        "in_features": k,
        "tokens": m,
        "us": times,
        "TFLOPs": {name: flops / us / 1e6 for name, us in times.items()},
        "ours_fp32_vs_bnb": times["ours_fp32_grad"] / times["bnb"],
        "ours_bf16_vs_bnb": times["ours_bf16_grad"] / times["bnb"],
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", help="write the results JSON here")
    args = ap.parse_args()
    rows = []
    print(
        f"{'shape':>12} {'M':>5} | {'ours fp32 us':>12} {'TF/s':>6} | {'ours bf16 us':>12} | {'bnb us':>8} | "
        f"{'dense us':>8} | {'fp32/bnb':>8} {'bf16/bnb':>8}"
    )
    for n, k, m in SHAPES:
        r = bench_shape(n, k, m)
        rows.append(r)
        t = r["us"]
        print(
            f"{f'{n}x{k}':>12} {m:>5} | {t['ours_fp32_grad']:12.2f} {r['TFLOPs']['ours_fp32_grad']:6.1f} | "
            f"{t['ours_bf16_grad']:12.2f} | {t['bnb']:8.2f} | {t['dense_bf16']:8.2f} | "
            f"{r['ours_fp32_vs_bnb']:8.2f} {r['ours_bf16_vs_bnb']:8.2f}",
            flush=True,
        )
        torch.cuda.empty_cache()
    if args.out:
        with open(args.out, "w", encoding="utf-8") as fh:
            json.dump(
                {
                    "device": torch.cuda.get_device_name(),
                    "torch": torch.__version__,
                    "shapes": rows,
                },
                fh,
                indent=1,
            )


if __name__ == "__main__":
    main()

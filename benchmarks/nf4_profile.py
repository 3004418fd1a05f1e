"""Run one fused NF4 forward of a given shape a few times, for a profiler to look at.

Usage on a CUDA machine:  ncu --clock-control none -k regex:nf4_ --launch-skip 2 --launch-count 1 \
    python benchmarks/nf4_profile.py N K M [--path wgmma|ws|dequant --tile T] [--dtype bfloat16]
(also prints where the module's cubin is, for ``cuobjdump --dump-sass``).
"""

from __future__ import annotations

import argparse
from contextlib import nullcontext

import torch
from nf4_kernels import forced_path  # this directory is on sys.path when run as a script


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("n", type=int, help="out features")
    ap.add_argument("k", type=int, help="in features")
    ap.add_argument("m", type=int, help="tokens")
    ap.add_argument("--path", choices=("wgmma", "ws", "dequant"), help="force this many-token path")
    ap.add_argument("--tile", type=int, default=128, help="tokens per block of a forced fused path")
    ap.add_argument("--dtype", default="bfloat16", choices=("float32", "float16", "bfloat16"))
    ap.add_argument("--calls", type=int, default=4)
    args = ap.parse_args()
    from aner_lang.runtime.nf4.fused import compiler, ops
    from aner_lang.runtime.nf4.fused.backend import nf4_tensors
    from aner_lang.runtime.nf4.quant import quantize_nf4

    dtype = getattr(torch, args.dtype)
    w = nf4_tensors(quantize_nf4(torch.randn(args.n, args.k) * 0.05).to("cuda"))
    x = torch.randn(args.m, args.k, device="cuda", dtype=dtype)
    with forced_path(ops, args.path, args.tile) if args.path else nullcontext():
        for _ in range(args.calls):
            ops.linear(x, w)
        torch.cuda.synchronize()
        path = ops.path(args.m, dtype, x.device, args.n, args.k)
    mod = compiler.load(torch.cuda.current_device())
    print(f"path {path}  cubin {mod.path}")


if __name__ == "__main__":
    main()

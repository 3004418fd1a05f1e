"""What pinning `offload`'s host copies costs, by each way torch can pin: the copies of a whole
forward at a benchmark shape (`--shape`, train_scale's; `footprint.offload_copy_bytes`, in the
forward's order), each asked of torch's caching host allocator as `HostCopies` asks it, timed

* the first time (pinned afresh: what a run's first offloaded update waits for),
* again after they were freed (from torch's cache: every later update),
* while the main thread runs bf16 GEMMs the whole time (`--overlap`): whether pinning ahead on
  another thread would hide behind compute, and what it takes from the GEMMs;

with the copy bandwidth of the largest copy in and out of that memory. Each setting runs in a
fresh process (the allocator reads its settings once and caches what it pinned): torch's default
(`cudaHostAlloc`) and `pinned_use_cuda_host_register` with 1, 8 and 16 threads (`malloc`, the
pages touched by that many threads, then `cudaHostRegister`), the latter with 8 threads also set by
the process itself at run time; and `exact`, `model.pinned_blocks` (as `offload` pins: each copy
registered at exactly its bytes, its pages touched by torch's threads).

    python benchmarks/pinned_alloc.py --tokens 16384 --out /tmp/pinned_alloc.json
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

from train_scale import SHAPES  # this directory is on sys.path

from aner_lang.runtime.model.config import config_from_hf
from aner_lang.runtime.train.footprint import layer_shape, offload_copy_bytes

SETTINGS = {
    "default": "",
    "register-1": "pinned_use_cuda_host_register:True,pinned_num_register_threads:1",
    "register-8": "pinned_use_cuda_host_register:True,pinned_num_register_threads:8",
    "register-16": "pinned_use_cuda_host_register:True,pinned_num_register_threads:16",
    "register-8-set": "pinned_use_cuda_host_register:True,pinned_num_register_threads:8",
    "exact": "",
}
"""Settings by name; one named `*-set` is applied by the process itself (`child`'s `applied`)
before it pins anything, not by the environment: can a run switch it on for itself? `exact`
pins through `model.pinned_blocks`, as `offload` does, instead of torch's allocator."""
GEMM = (8192, 4096, 14336)
"""The GEMM the overlap runs beside the pinning: an 8B gate projection over 8,192 tokens."""


def copy_sizes(shape: str, tokens: int) -> list[int]:
    """Every copy a bf16 forward of `shape` keeps, in bytes, layer by layer."""
    config = config_from_hf({"model_type": "llama", **SHAPES[shape]}, Path(shape))
    return offload_copy_bytes(tokens, layer_shape(config), 2) * config.num_hidden_layers


def _pin(sizes: list[int], exact: bool) -> tuple[float, list[Any]]:
    import torch

    from aner_lang.runtime.model import pinned_blocks

    start = time.perf_counter()
    if exact:
        meta = [torch.empty(n, dtype=torch.uint8, device="meta") for n in sizes]
        held = [pinned_blocks.empty_like(t) for t in meta]
    else:
        held = [torch.empty(n, dtype=torch.uint8, pin_memory=True) for n in sizes]
    return time.perf_counter() - start, held


def _bandwidth(host: Any) -> dict[str, float]:
    """GB/s of copying `host` to the GPU and back, five times each."""
    import torch

    device = torch.empty_like(host, device="cuda")
    rates = {}
    for name, dst, src in (("h2d", device, host), ("d2h", host, device)):
        dst.copy_(src, non_blocking=True)
        torch.cuda.synchronize()
        start = time.perf_counter()
        for _ in range(5):
            dst.copy_(src, non_blocking=True)
        torch.cuda.synchronize()
        rates[f"{name}_gb_per_s"] = 5 * host.numel() / (time.perf_counter() - start) / 1e9
    return rates


def _gemm_rate(seconds: float, until: threading.Event | None = None) -> float:
    """TFLOP/s of the GEMM run back to back for `seconds`, or until `until` is set."""
    import torch

    m, k, n = GEMM
    a = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(k, n, device="cuda", dtype=torch.bfloat16)
    torch.cuda.synchronize()
    count, start = 0, time.perf_counter()
    while (until is None and time.perf_counter() - start < seconds) or (
        until is not None and not until.is_set()
    ):
        for _ in range(8):
            a @ b
        torch.cuda.synchronize()
        count += 8
    return count * 2 * m * k * n / (time.perf_counter() - start) / 1e12


def child(sizes: list[int], overlap: bool, applied: str, exact: bool) -> dict[str, Any]:
    """One setting's row: `sizes` pinned as the module docstring says, beside GEMMs with
    `overlap`; `applied`, where given, set through torch's allocator settings first; with
    `exact`, through `pinned_blocks`."""
    import torch

    from aner_lang.runtime.model import pinned_blocks

    if applied:
        torch._C._accelerator_setAllocatorSettings(applied)
    torch.cuda.init()
    result: dict[str, Any] = {"bytes_asked": sum(sizes)}
    if overlap:
        alone = _gemm_rate(2.0)
        done, pinned = threading.Event(), dict[str, Any]()

        def pin() -> None:
            pinned["seconds"], pinned["held"] = _pin(sizes, exact)
            done.set()

        thread = threading.Thread(target=pin)
        thread.start()
        beside = _gemm_rate(0.0, done)
        thread.join()
        result |= {"gemm_tflops_alone": alone, "gemm_tflops_beside_pinning": beside,
                   "first_seconds_beside_gemms": pinned["seconds"]}  # fmt: skip
        return result
    first, held = _pin(sizes, exact)
    result |= {"first_seconds": first, **_bandwidth(held[0])}
    del held
    torch.cuda.synchronize()
    result["again_seconds"], held = _pin(sizes, exact)
    stats = torch.cuda.host_memory_stats()  # while the second pass still holds its copies
    result["pinned_bytes"] = (
        pinned_blocks.pinned_bytes(torch.device("meta"))
        if exact
        else stats.get("allocated_bytes.current")
    )
    result["host_alloc_seconds"] = stats.get("host_alloc_time.total", 0) / 1e6  # from us
    result["copies"] = len(held)
    return result


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shape", default="llama3-8b", help="one of train_scale's shapes")
    ap.add_argument("--tokens", type=int, default=16384)
    ap.add_argument("--settings", default=",".join(SETTINGS))
    ap.add_argument("--overlap", action="store_true", help="also pin beside GEMMs")
    ap.add_argument("--child", choices=("pin", "overlap"), help=argparse.SUPPRESS)
    ap.add_argument("--apply", default="", help=argparse.SUPPRESS)
    ap.add_argument("--exact", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--out")
    args = ap.parse_args(argv)
    sizes = copy_sizes(args.shape, args.tokens)
    if args.child:
        print(json.dumps(child(sizes, args.child == "overlap", args.apply, args.exact)))
        return 0
    rows = []
    for name in args.settings.split(","):
        applied = SETTINGS[name] if name.endswith("-set") else ""
        env = {**os.environ, "PYTORCH_CUDA_ALLOC_CONF": "" if applied else SETTINGS[name]}
        for mode in ("pin", "overlap") if args.overlap else ("pin",):
            cmd = [sys.executable, __file__, "--child", mode, "--apply", applied,
                   "--shape", args.shape, "--tokens", str(args.tokens)]  # fmt: skip
            cmd += ["--exact"] if name == "exact" else []
            done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
            if done.returncode:
                row = {"error": done.stderr.strip().splitlines()[-1:]}
            else:
                row = json.loads(done.stdout.strip().splitlines()[-1])
            rows.append({"setting": name, "mode": mode, **row})
            print(json.dumps(rows[-1]), flush=True)
            if args.out:  # after each row: a call cut short keeps the rows it has
                with open(args.out, "w") as f:
                    json.dump({"shape": args.shape, "tokens": args.tokens, "rows": rows}, f)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""The fused path for GGUF blocks on CUDA (`storage: gguf` under `kernel: fused`, which `auto`
picks where CUDA and CuPy are): NVRTC kernels (kernels/ggml.cu) that decode the file's blocks on
the GPU, compiled once per block type the run meets.

Which kernel a call uses follows the NF4 fused path's rule (`nf4.fused.ops`), on the number of
tokens M (rows of x):

* M <= 16 (generation, evaluation of a few rows): memory-bound kernels that decode the blocks in
  registers and never write the dense weight. Forward: a warp per output row. Input gradient:
  each warp sums its rows into a slab of its own, which are added here in a fixed order (the same
  bits on every run, which exact resume relies on). fp32 accumulation throughout.
* M > 16 (training): one kernel decodes the weight into the reused buffer of
  `model.dense_matmul` and cuBLAS multiplies, for the forward and the input gradient. Past a few
  hundred tokens that GEMM is compute-bound and the decode is a small share of it (the NF4
  measurements in benchmarks/results/h200_nf4_kernels.json show the same for NF4's buffer).

The decoded weight is bit-identical to the torch dequantizers of `io.ggml_blocks` (and so to the gguf
package's references), rounded to the compute dtype only where it is stored.
"""

from __future__ import annotations

from dataclasses import replace
from functools import cache

import numpy as np
import torch

from aner_lang.problems.errors import AnerRuntimeError
from aner_lang.runtime.ggml.weight import GGUFWeight
from aner_lang.runtime.model import dense_matmul
from aner_lang.runtime.model.precision import compute_dtype
from aner_lang.runtime.nf4.fused import compiler
from aner_lang.runtime.nf4.fused.availability import require_fused
from aner_lang.runtime.nf4.fused.launch import (
    DT_NAME,
    aligned_rows,
    device_index,
    launch,
    ptr,
    sm_count,
    token_bucket,
)

FEW_MAX_TOKENS = 16
_WARPS = 4  # warps per block of the few-token kernels


SOURCE = compiler.KernelSource("aner_lang.runtime.ggml", "ggml.cu", "ggml-fused")


@cache
def source(qtype: str) -> compiler.KernelSource:
    """The kernels of one GGML block type: a module of its own (`-DGGML_<qtype>`)."""
    return replace(SOURCE, defines=(f"-DGGML_{qtype}",))


def _raw(w: GGUFWeight) -> torch.Tensor:
    raw = w.raw
    if not raw.is_cuda or not raw.is_contiguous():
        raise AnerRuntimeError(
            f"fused GGUF kernels need the {w.shape[0]}x{w.shape[1]} {w.qtype} blocks as one "
            "contiguous CUDA tensor",
            code="E-KERNEL-DEVICE",
        )
    return raw


def _launch(
    device: torch.device, w: GGUFWeight, name: str, grid: tuple[int, ...], args: list
) -> None:
    launch(device, name, grid, 32 * _WARPS, [ptr(_raw(w)), *args], source=source(w.qtype))


def dequantize(
    w: GGUFWeight, dtype: torch.dtype, rows: tuple[int, int] | None = None, reuse: bool = False
) -> torch.Tensor:
    """Rows `[r0, r1)` (default all) of the weight as a `[rows, in]` `dtype` matrix; with `reuse`
    in the shared buffer of `dense_matmul`, which the next call overwrites."""
    r0, r1 = rows if rows is not None else (0, w.shape[0])
    k = w.shape[1]
    n = (r1 - r0) * k
    device = w.raw.device
    out = dense_matmul.buffer(n, dtype, device, reuse)
    groups = n // 8
    threads = 32 * _WARPS
    _launch(
        device,
        w,
        f"ggml_dequant_{DT_NAME[dtype]}",
        (-(-groups // threads),),
        [np.int64(r0 * k // 8), np.int64(groups), ptr(out)],
    )
    return out.view(r1 - r0, k)


def _dense_rows(w: GGUFWeight) -> dense_matmul.DenseRows:
    return lambda dtype, r0, r1: dequantize(w, dtype, (r0, r1), reuse=True)


def linear(x: torch.Tensor, w: GGUFWeight, out_dtype: torch.dtype | None = None) -> torch.Tensor:
    """`x @ W^T` for x `[..., in]`, computed in x's dtype (fp32 accumulation), in `out_dtype`."""
    n, k = w.shape
    out_dtype = out_dtype or x.dtype
    lead, x2 = x.shape[:-1], aligned_rows(x, k)
    m = x2.shape[0]
    if m > FEW_MAX_TOKENS:
        return dense_matmul.linear(x2, w.shape, _dense_rows(w), out_dtype).view(*lead, n)
    y = torch.empty(m, n, dtype=torch.float32, device=x.device)
    if m:
        _launch(
            x.device,
            w,
            f"ggml_gemv_{DT_NAME[x.dtype]}_m{token_bucket(m)}",
            (-(-n // _WARPS),),
            [ptr(x2), ptr(y), np.int32(m), np.int32(n), np.int32(k)],
        )
    return y.to(out_dtype).view(*lead, n)


def grad_input(
    grad_y: torch.Tensor, w: GGUFWeight, out_dtype: torch.dtype | None = None
) -> torch.Tensor:
    """`grad_y @ W` for grad_y `[..., out]`, in grad_y's dtype with fp32 accumulation."""
    n, k = w.shape
    out_dtype = out_dtype or grad_y.dtype
    lead, g2 = grad_y.shape[:-1], aligned_rows(grad_y, n)
    m = g2.shape[0]
    if m > FEW_MAX_TOKENS:
        return dense_matmul.grad_input(g2, w.shape, _dense_rows(w), out_dtype).view(*lead, k)
    kblocks = -(-(k // 8) // 32)  # a lane per 8 input features
    rows = _split_rows(n, kblocks, sm_count(device_index(grad_y.device)))
    splits = -(-n // rows)
    parts = torch.empty(splits * _WARPS, m, k, dtype=torch.float32, device=grad_y.device)
    if m:
        _launch(
            grad_y.device,
            w,
            f"ggml_bwd_{DT_NAME[grad_y.dtype]}_m{token_bucket(m)}",
            (kblocks, splits),
            [ptr(g2), ptr(parts), np.int32(m), np.int32(n), np.int32(k), np.int32(rows)],
        )
    return parts.sum(0).to(out_dtype).view(*lead, k)


def _split_rows(n: int, kblocks: int, sms: int) -> int:
    """Rows of W each block sums over: about four blocks per multiprocessor, at least a row per
    warp (fewer, longer slabs cost memory; more blocks hide the decode's latency)."""
    splits = max(1, (4 * sms) // kblocks)
    return max(_WARPS, -(-n // splits))


class GGUFFused:
    """`storage: gguf` matmuls on CUDA through the kernels above (the NF4 backend protocol)."""

    name = "fused"

    def __init__(self) -> None:
        require_fused()

    def linear(self, x: torch.Tensor, w: GGUFWeight) -> torch.Tensor:
        # In the autocast dtype, returned in x's dtype from fp32 accumulators (as NF4's fused path).
        return linear(x.to(compute_dtype(x)), w, out_dtype=x.dtype)

    def grad_input(self, grad_y: torch.Tensor, w: GGUFWeight) -> torch.Tensor:
        return grad_input(grad_y, w)  # outside autocast: in the gradient's dtype

    def dense(self, w: GGUFWeight, dtype: torch.dtype) -> torch.Tensor:
        return dequantize(w, dtype, reuse=True)

    def identity(self, device: torch.device, dtype: torch.dtype) -> str:
        """The kernels' identity for `dtype` inputs on `device`: source, options and architecture
        (the block type's define is the only per-module option, and the file fixes the types)."""
        capability = torch.cuda.get_device_capability(device_index(device))
        arch = compiler.target_arch("".join(map(str, capability)))
        compute = str(dtype).removeprefix("torch.")
        return (
            f"aner.gguf.cuda.fused/1;source_sha256={SOURCE.sha256()};"
            f"options={' '.join(compiler.OPTIONS)};arch={arch};compute={compute};accumulate=float32"
        )

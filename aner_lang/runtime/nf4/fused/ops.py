"""The fused NF4 operations on torch CUDA tensors: dequantize, linear forward, backward to the input.

Kernels run on torch's current stream (CuPy is told about it as an external stream), read and write
torch tensors in place by pointer, and never synchronise the host, so they can be captured in a
CUDA graph. Which kernel a call uses depends on the number of tokens M (rows of x); each rule is
the measured fastest choice on the H200 (figures and the designs tried and dropped:
benchmarks/results/h200_nf4_kernels.json and h200_nf4_design_notes.md):

* M <= 16 ("small", generation and evaluation): memory-bound fused kernels that dequantize in
  registers. float32: one warp per output row on CUDA cores. float16/bfloat16: mma.sync m16n8k16
  tensor-core tiles with fp32 accumulation, multiplying the rounded NF4 codes and scaling each
  64-block's partial sums by its absmax. Backward to the input likewise, with fp32 atomics.
* 16 < M <= 1024, float16/bfloat16 on Hopper (sm_90a), K >= 4096, on weights wide enough to fill the
  GPU (``_uses_tma``): the TMA-fed fused GEMM (``tma_kernel`` picks the block shape). One producer
  thread copies x's tile and the packed weight bytes with the Tensor Memory Accelerator into a ring
  of shared-memory stages; the two MMA warpgroups dequantize their weight rows straight into the
  wgmma's register operand (per-block tables of the 16 rounded values in registers, byte-permute
  lookups) and multiply by x's tile in shared memory. On long inputs (K >= TMA_SPLIT_MIN_K) a
  cluster of two blocks splits a tile's k-steps and adds the sums through distributed shared
  memory, so each block reads half as much of x for the same work. The 16-bit results leave
  through shared memory as whole 128-byte rows, and the kernel is launched to overlap the one
  before it (programmatic.py). Why it wins: the dequantization runs between the wgmmas of the
  same warps, so the two overlap and the dense weight is never written. Past 1024 tokens the GEMM
  is compute-bound and dequantize + cuBLAS wins.
* Otherwise 16 < M <= 128 on wide weights (about one 128-row block per multiprocessor or more,
  e.g. the lm_head), float16/bfloat16 on Hopper: one fused GEMM on warpgroup MMAs (wgmma). Mostly
  the warp-specialized one (``_uses_ws``, ``ws_tile``): two producer warpgroups dequantize W into
  shared memory and copy x beside it, two consumer warpgroups only issue wgmmas. Up to 32 tokens
  on narrow inputs, the one whose A operand is the weight dequantized straight into the MMA warps'
  registers (``_uses_wgmma``, ``wgmma_tile``). Both cost a fixed ~0.6-0.75 us per 64-wide k-step
  per block, so neither is used past one wave of blocks: moving tiles through shared memory costs
  more than dequantize + cuBLAS there.
* Other M > 16 (past 1024 tokens, float32, few input features or narrow weights, GPUs without
  wgmma), and every backward with M > 16: the weight is dequantized by one kernel into a buffer
  reused across layers, then cuBLAS (torch) multiplies, in one piece (chunking it, with or without
  overlap on a side stream, was slower for every shape measured). Only a weight larger than
  ``chunking.DEQUANT_MAX_ELEMENTS`` (a large vocabulary's lm_head) goes in row slices, so the
  buffer stays a decoder layer's size: the backward sums the slices' fp32 products in order.

``linear`` and ``grad_input`` take an ``out_dtype``: under a half-precision profile the fused
backend asks for float32 outputs, which the kernels' fp32 accumulators give for free, so no
frozen-base product is rounded to 16 bits on its way back into the fp32 residual stream.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np
import torch

from aner_lang.problems.errors import AnerRuntimeError
from aner_lang.runtime.model import dense_matmul
from aner_lang.runtime.nf4.fused import compiler, tensor_map
from aner_lang.runtime.nf4.fused.launch import (
    DT_NAME,
    aligned_rows,
    device_index,
    launch,
    ptr,
    sm_count,
    token_bucket,
)

SMALL_MAX_TOKENS = 16


_POINTERS = ("packed", "qabsmax", "code2", "absmax2", "offset")


@dataclass(frozen=True)
class NF4Tensors:
    """The device tensors of one double-quantized NF4 weight [out_features, in_features]."""

    packed: torch.Tensor  # uint8 [N*K/2], high nibble first
    qabsmax: torch.Tensor  # uint8 [N*K/64]
    code2: torch.Tensor  # float32 [256]
    absmax2: torch.Tensor  # float32 [ceil(N*K/64/256)]
    offset: torch.Tensor  # float32, one element (read by the kernels: no host sync)
    out_features: int
    in_features: int
    _pointers: tuple[np.uint64, ...] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        n, k = self.out_features, self.in_features
        if k % 64:
            raise AnerRuntimeError(
                f"fused NF4 kernels need in_features % 64 == 0, got a {n}x{k} weight",
                code="E-KERNEL-SHAPE",
                notes=("use kernel: host_tiled",),
            )
        for name in _POINTERS:
            t = getattr(self, name)
            if not t.is_cuda or not t.is_contiguous():
                raise AnerRuntimeError(
                    f"fused NF4 kernels need '{name}' as a contiguous CUDA tensor",
                    code="E-KERNEL-DEVICE",
                )
        if self.packed.data_ptr() % 16:  # 16-byte loads and TMA copies
            raise AnerRuntimeError(
                f"fused NF4 kernels need the packed bytes of the {n}x{k} weight 16-byte aligned",
                code="E-KERNEL-DEVICE",
                notes=("pass a tensor of its own, not a view into a buffer",),
            )
        if self.packed.numel() != n * k // 2 or self.qabsmax.numel() != n * k // 64:
            raise AnerRuntimeError(
                f"NF4 tensors do not match a {n}x{k} weight "
                f"({self.packed.numel()} packed bytes, {self.qabsmax.numel()} absmax codes)",
                code="E-KERNEL-SHAPE",
            )
        object.__setattr__(self, "_pointers", tuple(ptr(getattr(self, p)) for p in _POINTERS))

    def args(self) -> list[np.uint64]:
        """The kernels' leading arguments: the five device pointers."""
        return list(self._pointers)

    def points_at(self, *tensors: torch.Tensor) -> bool:
        """Whether the pointers are still those of ``tensors`` (given in ``args`` order)."""
        return all(t.data_ptr() == p for t, p in zip(tensors, self._pointers))


def _module(device: torch.device) -> compiler.CompiledModule:
    return compiler.load(device_index(device))


# ---- dequantize ------------------------------------------------------------------------------


def dequantize(
    w: NF4Tensors, dtype: torch.dtype, *, rows: tuple[int, int] | None = None, reuse: bool = False
) -> torch.Tensor:
    """The dense weight (rows ``[r0, r1)``, default all) as a [rows, K] ``dtype`` matrix. With
    ``reuse`` it lives in the shared buffer of ``dense_matmul``, which the next call overwrites
    (stream order makes that safe for the matmul that consumes it)."""
    r0, r1 = rows if rows is not None else (0, w.out_features)
    k = w.in_features
    n = (r1 - r0) * k
    device = w.packed.device
    out = dense_matmul.buffer(n, dtype, device, reuse)
    threads = 256
    launch(
        device,
        f"nf4_dequant_{DT_NAME[dtype]}",
        ((n // 32 + threads - 1) // threads,),
        threads,
        [*w.args(), np.int64(r0 * k), np.int64(n), ptr(out)],
    )
    return out.view(r1 - r0, k)


def _dense_rows(w: NF4Tensors) -> dense_matmul.DenseRows:
    return lambda dtype, r0, r1: dequantize(w, dtype, rows=(r0, r1), reuse=True)


def _many_linear(x2: torch.Tensor, w: NF4Tensors, out_dtype: torch.dtype) -> torch.Tensor:
    return dense_matmul.linear(x2, (w.out_features, w.in_features), _dense_rows(w), out_dtype)


def _many_grad_input(g2: torch.Tensor, w: NF4Tensors, out_dtype: torch.dtype) -> torch.Tensor:
    return dense_matmul.grad_input(g2, (w.out_features, w.in_features), _dense_rows(w), out_dtype)


# ---- many-token forward on Hopper ----------------------------------------------------------------

WGMMA_ROWS = 128  # weight rows per block: two warpgroups of 64
WGMMA_TILES = (32, 64, 128, 256)  # tokens per block (the wgmma's N)


def wgmma_smem_bytes(tile: int) -> int:
    """Dynamic shared memory of one block (mirrors WgmmaShape in nf4.cu): 1024 alignment slack,
    6 stages (5 for the largest tile) of x (tile x 128 bytes) and packed W rows (128 x 48)."""
    stages = 5 if tile == 256 else 6
    return 1024 + stages * (tile * 128 + WGMMA_ROWS * 48)


def wgmma_tile(m: int) -> int:
    """Tokens per block: the smallest tile that holds all M tokens (each extra token tile
    dequantizes the whole weight again); the largest tile past that."""
    return next((t for t in WGMMA_TILES if m <= t), WGMMA_TILES[-1])


def _uses_wgmma(m: int, dtype: torch.dtype, device: torch.device, n: int) -> bool:
    """Rule: the fused GEMM for up to 128 tokens (one token tile), on weights with enough 128-row
    blocks to give about every multiprocessor one (the lm_head, wide MLP projections). Reason:
    elsewhere its per-token-tile dequantization costs more than writing the dense weight once
    (benchmarks/results/h200_nf4_kernels.json)."""
    if not (
        SMALL_MAX_TOKENS < m <= WGMMA_TILES[2]
        and dtype != torch.float32
        and _module(device).has_wgmma
    ):
        return False
    return -(-n // WGMMA_ROWS) >= 0.75 * sm_count(device_index(device))


def _wgmma_linear(x2: torch.Tensor, w: NF4Tensors, out_dtype: torch.dtype) -> torch.Tensor:
    m, n = x2.shape[0], w.out_features
    tile = wgmma_tile(m)
    return _out16_or_32(
        x2,
        w,
        out_dtype,
        f"nf4_wgmma_fwd_{DT_NAME[x2.dtype]}_m{tile}",
        (-(-n // WGMMA_ROWS), -(-m // tile)),
        256,
        wgmma_smem_bytes(tile),
    )


# ---- many-token forward on Hopper, warp-specialized ---------------------------------------------

WS_TILES = (64, 128)  # tokens per block of the warp-specialized kernel
WS_MIN_K = (
    1024  # below this many input features, up to 32 tokens: the register-operand kernel's 32 tile
)


def ws_smem_bytes(tile: int) -> int:
    """Dynamic shared memory of one warp-specialized block (mirrors WsShape in nf4.cu): 1024
    alignment slack, as many stages of a W tile (128 x 128 bytes) and an x tile (tile x 128 bytes)
    as fit in 192 KB."""
    stage = WGMMA_ROWS * 128 + tile * 128
    return 1024 + (192 * 1024 // stage) * stage


def ws_tile(m: int) -> int:
    """Tokens per block: the smaller tile while it holds every token."""
    return WS_TILES[0] if m <= WS_TILES[0] else WS_TILES[1]


def _uses_ws(m: int, dtype: torch.dtype, device: torch.device, n: int, k: int) -> bool:
    """Rule: where a fused GEMM is picked (``_uses_wgmma``) and the TMA-fed one is not
    (``_uses_tma`` is tried first), the warp-specialized GEMM, except for up to 32 tokens on
    inputs narrower than WS_MIN_K. Reason: overlapping the dequantization warps with the MMA warps
    pays once there are enough k-steps to overlap; with few k-steps (a 576-wide input) the
    register-operand kernel's 32-token tile has less fixed cost. Figures: benchmarks/results/
    h200_nf4_kernels.json."""
    return _uses_wgmma(m, dtype, device, n) and (k >= WS_MIN_K or m > WGMMA_TILES[0])


def _ws_linear(x2: torch.Tensor, w: NF4Tensors, out_dtype: torch.dtype) -> torch.Tensor:
    m, n = x2.shape[0], w.out_features
    tile = ws_tile(m)
    return _out16_or_32(
        x2,
        w,
        out_dtype,
        f"nf4_ws_fwd_{DT_NAME[x2.dtype]}_m{tile}",
        (-(-n // WGMMA_ROWS), -(-m // tile)),
        512,
        ws_smem_bytes(tile),
    )


# ---- many-token forward on Hopper, TMA-fed -------------------------------------------------------

# (tokens, weight rows, k-splits) per block, most work first (k-splits: a cluster of that many
# blocks shares one tile's k-steps and adds their sums through distributed shared memory)
TMA_KERNELS = (
    (256, 128, 1),
    (256, 128, 2),
    (256, 64, 1),
    (128, 128, 1),
    (128, 128, 2),
    (128, 64, 1),
)
# Splitting k halves the x tiles each block reads for the same dequantization work per weight as
# a 64-row block; it pays on long inputs (K = 14336) and ties or loses at K = 4096.
TMA_SPLIT_MIN_K = 8192
TMA_TOKENS = (
    64,
    1024,
)  # M <= 1024 (past it cuBLAS on the dequantized weight wins); M <= 64: wide weights
# A block takes about 0.5 us per 64-wide k-step, so few k-steps leave little to overlap; on short
# inputs the warp-specialized GEMM or dequantize + cuBLAS wins.
TMA_MIN_K = 4096


def tma_smem_bytes(tile: int, rows: int) -> int:
    """Dynamic shared memory of one TMA-fed block (mirrors TmaShape in nf4.cu): 1024 alignment
    slack, up to 8 stages of an x tile (tile x 128 bytes) and the rows' packed bytes (rows x 32)
    within 200 KB."""
    stage = tile * 128 + rows * 32
    return 1024 + min(8, 200 * 1024 // stage) * stage


def _tma_grid(m: int, n: int, shape: tuple[int, int, int]) -> tuple[int, int, int]:
    """The launch grid of block shape (tokens, rows, k-splits): row blocks x token blocks x
    k-splits. The shape rules count these same blocks."""
    return -(-n // shape[1]), -(-m // shape[0]), shape[2]


def tma_kernel(m: int, n: int, k: int, device: torch.device) -> tuple[int, int, int]:
    """Rule: the block shape with the most work per block that still gives about every
    multiprocessor a block (0.75 blocks per SM), with token tiles no larger than M needs and k split
    only from TMA_SPLIT_MIN_K; failing that, the shape with the most blocks. Reason: each token tile
    dequantizes the weight again and each row block reads x again, so bigger blocks do less
    redundant work, until the grid leaves multiprocessors idle. The rule picks the measured
    fastest shape on nearly all shapes benchmarked (benchmarks/results/h200_nf4_kernels.json);
    the known exception is 4096x4096 at 768 tokens, where a grid just under the threshold wins."""
    sms = sm_count(device_index(device))
    shapes = [
        c for c in TMA_KERNELS if (c[0] == 128 or m > 128) and (c[2] == 1 or k >= TMA_SPLIT_MIN_K)
    ]
    return next(
        (c for c in shapes if math.prod(_tma_grid(m, n, c)) >= 0.75 * sms),
        max(shapes, key=lambda c: math.prod(_tma_grid(m, n, c))),
    )


def _uses_tma(m: int, dtype: torch.dtype, device: torch.device, n: int, k: int) -> bool:
    """Rule: the TMA-fed GEMM for half precision with K >= TMA_MIN_K and at most TMA_TOKENS[1]
    tokens, and
    * up to 64 tokens, only on the wide weights where a fused GEMM beats cuBLAS at all
      (``_uses_wgmma``);
    * past 64 tokens, on a grid of at least 0.45 blocks per multiprocessor.
    Reason: dequantizing inside the GEMM saves writing and reading the dense weight, which
    dominates at few tokens; past ~1024 tokens the GEMM is compute-bound and cuBLAS on a dense
    copy wins; grids smaller than 0.45 blocks per SM leave too much of the GPU idle (and were not
    measured). Figures: benchmarks/results/h200_nf4_kernels.json."""
    if not (
        SMALL_MAX_TOKENS < m <= TMA_TOKENS[1]
        and k >= TMA_MIN_K
        and dtype != torch.float32
        and _module(device).has_wgmma
    ):
        return False
    if m <= TMA_TOKENS[0]:
        return _uses_wgmma(m, dtype, device, n)
    return math.prod(_tma_grid(m, n, tma_kernel(m, n, k, device))) >= 0.45 * sm_count(
        device_index(device)
    )


def _tma_linear(x2: torch.Tensor, w: NF4Tensors, out_dtype: torch.dtype) -> torch.Tensor:
    m, k = x2.shape
    n = w.out_features
    tile, rows, splits = shape = tma_kernel(m, n, k, x2.device)
    maps = (
        tensor_map.tiled_2d(x2.data_ptr(), 2, k, m, 64, tile, True),
        tensor_map.tiled_2d(w.packed.data_ptr(), 1, k // 2, n, 32, rows, False),
    )
    name = f"nf4_tma_fwd_{DT_NAME[x2.dtype]}_m{tile}_r{rows}" + ("_k2" if splits == 2 else "")
    return _out16_or_32(
        x2, w, out_dtype, name, _tma_grid(m, n, shape), 384, tma_smem_bytes(tile, rows), maps
    )


# ---- forward ---------------------------------------------------------------------------------


def path(
    tokens: int,
    dtype: torch.dtype,
    device: torch.device | None = None,
    out_features: int = 0,
    in_features: int = 0,
) -> str:
    """Which implementation a forward with this many tokens takes (for reports and benchmarks);
    with a CUDA ``device`` and the weight's shape the many-token answer says which fused GEMM,
    if any, runs there."""
    if tokens > SMALL_MAX_TOKENS:
        if device is not None and _uses_tma(tokens, dtype, device, out_features, in_features):
            return "fused-tma"
        if device is not None and _uses_ws(tokens, dtype, device, out_features, in_features):
            return "fused-wgmma-ws"
        if device is not None and _uses_wgmma(tokens, dtype, device, out_features):
            return "fused-wgmma"
        return "dequant+cublas"
    return "fused-gemv-fp32" if dtype == torch.float32 else "fused-mma"


def _matrix(t: torch.Tensor, w: NF4Tensors, width: int, what: str) -> torch.Tensor:
    """``t`` [..., width] checked against the weight and flattened to an aligned [rows, width]."""
    if t.dtype not in DT_NAME:
        raise AnerRuntimeError(
            f"fused NF4 kernels take float32, float16 or bfloat16 inputs, not {t.dtype}",
            code="E-KERNEL-DTYPE",
        )
    if t.device != w.packed.device:
        raise AnerRuntimeError(
            f"{what} on {t.device} but the NF4 weight on {w.packed.device}", code="E-KERNEL-DEVICE"
        )
    if t.shape[-1] != width:
        raise AnerRuntimeError(
            f"{what} has {t.shape[-1]} features, the {w.out_features}x{w.in_features} NF4 "
            f"weight needs {width}",
            code="E-KERNEL-SHAPE",
        )
    return aligned_rows(t, width)


def linear(x: torch.Tensor, w: NF4Tensors, out_dtype: torch.dtype | None = None) -> torch.Tensor:
    """y = x @ W^T for x [..., K], computed in x's dtype; the result has ``out_dtype`` (default
    x's dtype)."""
    n, k = w.out_features, w.in_features
    out_dtype = out_dtype or x.dtype
    lead, x2 = x.shape[:-1], _matrix(x, w, k, "input")
    m = x2.shape[0]
    if m == 0:
        return x.new_empty(*lead, n, dtype=out_dtype)
    if _uses_tma(m, x.dtype, x.device, n, k):
        return _tma_linear(x2, w, out_dtype).view(*lead, n)
    if _uses_ws(m, x.dtype, x.device, n, k):
        return _ws_linear(x2, w, out_dtype).view(*lead, n)
    if _uses_wgmma(m, x.dtype, x.device, n):
        return _wgmma_linear(x2, w, out_dtype).view(*lead, n)
    if m > SMALL_MAX_TOKENS:
        return _many_linear(x2, w, out_dtype).view(*lead, n)
    if x.dtype == torch.float32:
        y = torch.empty(m, n, dtype=torch.float32, device=x.device)
        warps = 4
        launch(
            x.device,
            f"nf4_gemv_f32_m{token_bucket(m)}",
            ((n + warps - 1) // warps,),
            32 * warps,
            [*w.args(), ptr(x2), ptr(y), np.int32(m), np.int32(n), np.int32(k)],
        )
        return y.to(out_dtype).view(*lead, n)
    return _out16_or_32(
        x2,
        w,
        out_dtype,
        f"nf4_mma_fwd_{DT_NAME[x.dtype]}_m{8 if m <= 8 else 16}",
        (-(-n // 16),),
        256,
    ).view(*lead, n)


def linear_adds_in_place(m: int, dtype: torch.dtype, device: torch.device, n: int, k: int) -> bool:
    """Whether `add_linear` of ``m`` tokens adds the product into its tensor in the GEMM itself:
    where the forward dequantizes and runs cuBLAS (many tokens in half precision)."""
    return dtype != torch.float32 and path(m, dtype, device, n, k) == "dequant+cublas"


def add_linear(x: torch.Tensor, w: NF4Tensors, into: torch.Tensor) -> torch.Tensor:
    """``into += x @ W^T`` for ``into`` [..., N] of x's dtype, returned: in the GEMM itself where
    `linear_adds_in_place`, otherwise `linear`'s product is added."""
    n, k = w.out_features, w.in_features
    x2 = _matrix(x, w, k, "input")
    m = x2.shape[0]
    if (
        into.dtype == x.dtype
        and into.is_contiguous()
        and linear_adds_in_place(m, x.dtype, x.device, n, k)
    ):
        dense_matmul.add_linear(x2, (n, k), _dense_rows(w), into.view(m, n))
        return into
    return into.add_(linear(x, w, out_dtype=into.dtype))


def _out16_or_32(
    x2: torch.Tensor,
    w: NF4Tensors,
    out_dtype: torch.dtype,
    name: str,
    grid: tuple[int, ...],
    block: int,
    shared_bytes: int = 0,
    maps: tuple[np.ndarray, ...] = (),
) -> torch.Tensor:
    """Launch a half-precision forward kernel that writes its fp32 accumulators either rounded to
    x's dtype (y16) or as they are (y32), whichever ``out_dtype`` asks for. A kernel given tensor
    ``maps`` (x's first) takes them ahead of the weight and reads x through them, not a pointer;
    those are the TMA GEMMs, which start with griddepcontrol.wait, so they are launched overlapping."""
    m, k = x2.shape
    y = torch.empty(
        m,
        w.out_features,
        dtype=out_dtype if out_dtype == torch.float32 else x2.dtype,
        device=x2.device,
    )
    f32, none = y.dtype == torch.float32, np.uint64(0)
    inputs = [*maps, *w.args()] if maps else [*w.args(), ptr(x2)]
    launch(
        x2.device,
        name,
        grid,
        block,
        [
            *inputs,
            none if f32 else ptr(y),
            ptr(y) if f32 else none,
            np.int32(m),
            np.int32(w.out_features),
            np.int32(k),
        ],
        shared_bytes,
        overlapping=bool(maps),
    )
    return y.to(out_dtype)


# ---- backward to the input -------------------------------------------------------------------


def grad_input(
    grad_y: torch.Tensor, w: NF4Tensors, out_dtype: torch.dtype | None = None
) -> torch.Tensor:
    """dL/dx = grad_y @ W for grad_y [..., N], computed in grad_y's dtype with fp32 accumulation;
    the result has ``out_dtype`` (default grad_y's dtype)."""
    n, k = w.out_features, w.in_features
    out_dtype = out_dtype or grad_y.dtype
    lead, g2 = grad_y.shape[:-1], _matrix(grad_y, w, n, "output gradient")
    m = g2.shape[0]
    if m == 0:
        return grad_y.new_empty(*lead, k, dtype=out_dtype)
    if _many_tokens_backward(m, n, grad_y.dtype):
        return _many_grad_input(g2, w, out_dtype).view(*lead, k)
    sms, threads = sm_count(device_index(grad_y.device)), 128
    if grad_y.dtype == torch.float32:  # a thread per 8 k
        name, kblocks, writers = (
            f"nf4_bwd_f32_m{token_bucket(m)}",
            (k // 8 + threads - 1) // threads,
            1,
        )
        rows = _split_rows(n, kblocks, sms, align=1)
    else:  # a warp per 256 k
        name = f"nf4_mma_bwd_{DT_NAME[grad_y.dtype]}_m{8 if m <= 8 else 16}"
        kblocks, writers = (k + 255) // 256, threads // 32
        rows = _split_rows(n, kblocks, sms, align=64)
    splits = (n + rows - 1) // rows
    # Every slice (and, in the mma kernel, every warp) sums into a slab of its own and the slabs
    # are added here in a fixed order: the same bits on every run, which exact resume
    # (1 + checkpoint + 1 == 2) relies on.
    parts = torch.zeros(splits * writers, m, k, dtype=torch.float32, device=grad_y.device)
    launch(
        grad_y.device,
        name,
        (kblocks, splits),
        threads,
        [*w.args(), ptr(g2), ptr(parts), np.int32(m), np.int32(n), np.int32(k), np.int32(rows)],
    )
    return parts.sum(0).to(out_dtype).view(*lead, k)


def _many_tokens_backward(m: int, n: int, dtype: torch.dtype) -> bool:
    """Whether the input gradient of ``m`` tokens against ``n`` outputs dequantizes and runs
    cuBLAS (many tokens, or an odd ``n`` in half precision: the mma kernel reads gy in pairs)."""
    return m > SMALL_MAX_TOKENS or bool(n % 2 and dtype != torch.float32)


def grad_adds_in_place(m: int, n: int, dtype: torch.dtype) -> bool:
    """Whether `add_grad_input` of ``m`` tokens against ``n`` outputs adds into its tensor in the
    GEMM itself (given a contiguous one of the gradient's dtype): where cuBLAS runs."""
    return _many_tokens_backward(m, n, dtype)


def add_grad_input(grad_y: torch.Tensor, w: NF4Tensors, into: torch.Tensor) -> torch.Tensor:
    """``into += grad_y @ W`` for ``into`` [..., K] of grad_y's dtype: where many tokens take
    cuBLAS, its GEMM adds into ``into`` (one rounding, no product tensor); otherwise
    ``grad_input``'s product is added."""
    n, k = w.out_features, w.in_features
    g2 = _matrix(grad_y, w, n, "output gradient")
    m = g2.shape[0]
    if (
        into.dtype == grad_y.dtype
        and into.is_contiguous()
        and grad_adds_in_place(m, n, grad_y.dtype)
    ):
        dense_matmul.add_grad_input(g2, (n, k), _dense_rows(w), into.view(m, k))
        return into
    return into.add_(grad_input(grad_y, w))


def _split_rows(n: int, kblocks: int, sms: int, *, align: int) -> int:
    """Rows of W each block sums over: enough blocks for ~4 per multiprocessor, rows a multiple
    of ``align`` (the tensor-core kernel's 4 warps take 16 rows each)."""
    splits = max(1, min(n // align, (4 * sms + kblocks - 1) // kblocks))
    rows = (n + splits - 1) // splits
    return (rows + align - 1) // align * align

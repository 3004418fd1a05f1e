"""Matmuls against a quantized frozen weight dequantized first: the many-token path of the fused
NF4 and GGUF backends (`nf4.fused.ops`, `ggml.fused`).

The dense weight goes into one buffer per device and dtype, reused by every layer (stream order
makes that safe: the matmul that reads it runs before the next dequantization writes it), then
cuBLAS multiplies. A weight larger than `chunking.DEQUANT_MAX_ELEMENTS` (a large vocabulary's
lm_head) goes in row slices, so the buffer stays a decoder layer's size; the input gradient sums
the slices' fp32 products in a fixed order, the same bits on every run.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from aner_lang.runtime.model.chunking import row_slices
from aner_lang.runtime.model.precision import matmul, matmul_add, matmul_into

DenseRows = Callable[[torch.dtype, int, int], torch.Tensor]
"""`dense_rows(dtype, r0, r1)`: rows `[r0, r1)` of the weight as a `[r1 - r0, in]` matrix."""

_BUFFERS: dict[tuple[torch.device, torch.dtype], torch.Tensor] = {}


def reused_buffers() -> list[torch.Tensor]:
    """The reused buffers as they are now (a CUDA graph recorded against them keeps them)."""
    return list(_BUFFERS.values())


def buffer(numel: int, dtype: torch.dtype, device: torch.device, reuse: bool) -> torch.Tensor:
    """Room for a dequantized weight of `numel` elements: with `reuse` the reused buffer's first
    `numel` elements (grown when a larger weight asks), else a tensor of its own."""
    if not reuse:
        return torch.empty(numel, dtype=dtype, device=device)
    buf = _BUFFERS.get((device, dtype))
    if buf is None or buf.numel() < numel:
        buf = _BUFFERS[(device, dtype)] = torch.empty(numel, dtype=dtype, device=device)
    return buf[:numel]


def linear(
    x2: torch.Tensor, shape: tuple[int, int], dense_rows: DenseRows, out_dtype: torch.dtype
) -> torch.Tensor:
    """`x2 @ W^T` for `x2` `[M, in]` and a weight of `shape` `[out, in]`, in `out_dtype`."""
    n, k = shape
    slices = row_slices(n, k)
    if len(slices) == 1:
        return matmul(x2, dense_rows(x2.dtype, 0, n).t(), out_dtype)
    y = torch.empty(x2.shape[0], n, dtype=out_dtype, device=x2.device)
    for r0, r1 in slices:  # each output column is one slice's product, as it is unsliced
        w_rows = dense_rows(x2.dtype, r0, r1).t()
        if out_dtype == x2.dtype:
            matmul_into(x2, w_rows, y[:, r0:r1])
        else:
            y[:, r0:r1] = matmul(x2, w_rows, out_dtype)
    return y


def add_linear(
    x2: torch.Tensor, shape: tuple[int, int], dense_rows: DenseRows, into: torch.Tensor
) -> torch.Tensor:
    """`into += x2 @ W^T` for `into` `[M, out]` of x2's dtype: the GEMM adds into it (beta 1: read
    in its epilogue, the sum rounded once) where the weight is one slice, otherwise `linear`'s
    product is added."""
    n, k = shape
    if len(row_slices(n, k)) == 1:
        return matmul_add(x2, dense_rows(x2.dtype, 0, n).t(), into)
    return into.add_(linear(x2, shape, dense_rows, into.dtype))


def grad_input(
    g2: torch.Tensor, shape: tuple[int, int], dense_rows: DenseRows, out_dtype: torch.dtype
) -> torch.Tensor:
    """`g2 @ W` for `g2` `[M, out]` and a weight of `shape` `[out, in]`, in `out_dtype`."""
    n, k = shape
    slices = row_slices(n, k)
    if len(slices) == 1:
        return matmul(g2, dense_rows(g2.dtype, 0, n), out_dtype)
    total = torch.zeros(g2.shape[0], k, dtype=torch.float32, device=g2.device)
    for r0, r1 in slices:  # fp32 products from cuBLAS's accumulators, summed in a fixed order
        total += matmul(g2[:, r0:r1], dense_rows(g2.dtype, r0, r1), torch.float32)
    return total.to(out_dtype)


def add_grad_input(
    g2: torch.Tensor, shape: tuple[int, int], dense_rows: DenseRows, into: torch.Tensor
) -> torch.Tensor:
    """`into += g2 @ W` for `into` `[M, in]` of g2's dtype: the GEMM adds into it where the
    weight is one slice, otherwise `grad_input`'s fixed-order sum is added."""
    n, k = shape
    if len(row_slices(n, k)) == 1:
        return matmul_add(g2, dense_rows(g2.dtype, 0, n), into)
    return into.add_(grad_input(g2, shape, dense_rows, into.dtype))

"""Compute dtypes: which dtype a matmul runs in under a precision profile, and fp32-accumulated
products.

Masters are always fp32; `float16`/`bfloat16` run the forward under `torch.autocast`. A frozen-base
product computed from half-precision operands is returned in the caller's dtype without being
rounded to 16 bits on the way (`matmul`), so the fp32 residual stream never sees a 16-bit copy.
"""

from __future__ import annotations

from contextlib import AbstractContextManager, nullcontext

import torch

DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}


def autocast(precision: str, device: torch.device) -> AbstractContextManager[object]:
    """The forward-pass context for `precision` on `device` (no-op for float32)."""
    if precision == "float32":
        return nullcontext()
    # no cast cache: the same numbers, and a step that CUDA graphs can record
    return torch.autocast(device_type=device.type, dtype=DTYPES[precision], cache_enabled=False)


def compute_dtype(t: torch.Tensor) -> torch.dtype:
    """The dtype a matmul on ``t`` runs in: the autocast dtype inside an autocast region of t's
    device type (the precision profile), else t's own."""
    if torch.is_autocast_enabled(t.device.type):
        return torch.get_autocast_dtype(t.device.type)
    return t.dtype


def matmul(a: torch.Tensor, b: torch.Tensor, out_dtype: torch.dtype) -> torch.Tensor:
    """``a @ b`` computed in a's dtype, returned in ``out_dtype``. On CUDA, half-precision operands
    give float32 results straight from cuBLAS's fp32 accumulators (``torch.mm``'s ``out_dtype``),
    so a frozen-base product is never rounded to 16 bits on its way into the fp32 residual
    stream; elsewhere the product is cast."""
    with torch.autocast(a.device.type, enabled=False):
        if a.is_cuda and out_dtype == torch.float32 and a.dtype in (torch.float16, torch.bfloat16):
            return torch.mm(a, b, out_dtype=torch.float32)
        return torch.mm(a, b).to(out_dtype)


def matmul_into(a: torch.Tensor, b: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
    """``a @ b`` written into ``out``, of a's dtype: on CUDA a column block of a larger row-major
    matrix is written in place with its leading dimension (cuBLAS's ldc), not through a copy."""
    with torch.autocast(a.device.type, enabled=False):
        return torch.mm(a, b, out=out)


def matmul_add(a: torch.Tensor, b: torch.Tensor, into: torch.Tensor) -> torch.Tensor:
    """``into += a @ b`` in one GEMM (cuBLAS's beta = 1: the sum formed from the fp32
    accumulators and rounded once), ``into`` of a's dtype."""
    with torch.autocast(a.device.type, enabled=False):
        return into.addmm_(a, b)

"""NF4 matmul backends and the one autograd Function that dispatches to them.

A backend computes `linear(x, w) = x @ W^T` and `grad_input(grad_y, w) = grad_y @ W` for an
`NF4Weight`; nothing else. The frozen base has no weight gradient, so the autograd Function saves
no activations at all: backward needs only the packed weight. `host_tiled` (pure torch, CPU and
CUDA) is built in; `fused` (NVRTC CUDA kernels) is loaded on first use so that machines without
CuPy never import it.
"""

from __future__ import annotations

from functools import cache
from typing import Protocol

import torch

from aner_lang.errors import AnerRuntimeError
from aner_lang.runtime.nf4 import host_tiled
from aner_lang.runtime.nf4.quant import NF4Weight

KERNELS = ("host_tiled", "fused", "auto")


class NF4Backend(Protocol):
    """What a kernel path provides."""

    name: str

    def linear(self, x: torch.Tensor, w: NF4Weight) -> torch.Tensor: ...

    def grad_input(self, grad_y: torch.Tensor, w: NF4Weight) -> torch.Tensor: ...


class HostTiled:
    """Dequantize bounded tiles into a reused buffer, then matmul (see host_tiled.py)."""

    name = "host_tiled"

    def __init__(self, tile_bytes: int = host_tiled.DEFAULT_TILE_BYTES) -> None:
        self.tile_bytes = tile_bytes

    def linear(self, x: torch.Tensor, w: NF4Weight) -> torch.Tensor:
        return host_tiled.linear(x, w, self.tile_bytes)

    def grad_input(self, grad_y: torch.Tensor, w: NF4Weight) -> torch.Tensor:
        return host_tiled.grad_input(grad_y, w, self.tile_bytes)


def resolve_kernel(kernel: str) -> str:
    """`auto` picks fused where CUDA kernels can run, host_tiled elsewhere; fused fails clearly."""
    from aner_lang.runtime.nf4.fused.availability import require_fused, unavailable_reason

    if kernel not in KERNELS:
        raise AnerRuntimeError(
            f"unknown NF4 kernel {kernel!r}; expected one of {KERNELS}", code="E-KERNEL-UNKNOWN"
        )
    if kernel == "auto":
        return "fused" if unavailable_reason() is None else "host_tiled"
    if kernel == "fused":
        require_fused()
    return kernel


@cache
def get_backend(kernel: str, tile_bytes: int = host_tiled.DEFAULT_TILE_BYTES) -> NF4Backend:
    """The backend object for a resolved kernel name (stateless, so one per name and tile size:
    every NF4Linear forward asks for it)."""
    if kernel == "host_tiled":
        return HostTiled(tile_bytes)
    if kernel == "fused":
        from aner_lang.runtime.nf4.fused.backend import FusedBackend

        return FusedBackend()
    raise AnerRuntimeError(f"no NF4 backend named {kernel!r}", code="E-KERNEL-UNKNOWN")


class NF4Matmul(torch.autograd.Function):
    """y = x @ W^T through a backend; gradient flows to x only (the NF4 base is frozen).

    The backward runs outside autocast, in the gradient's dtype: float32 for the fp32 residual
    stream, so a half-precision profile rounds the frozen base only in its forward products.
    (Measured on the real model: bfloat16 NF4 backwards moved LoRA gradients from 0.31 to 0.42
    scaled error against float32, float16 ones from 0.046 to 0.056.)"""

    @staticmethod
    def forward(ctx, x: torch.Tensor, w: NF4Weight, backend: NF4Backend) -> torch.Tensor:  # type: ignore[override]
        ctx.w, ctx.backend = w, backend
        return backend.linear(x, w)

    @staticmethod
    def backward(ctx, grad_y: torch.Tensor):  # type: ignore[override]
        grad_x = (
            ctx.backend.grad_input(grad_y.contiguous(), ctx.w) if ctx.needs_input_grad[0] else None
        )
        return grad_x, None, None


def nf4_matmul(x: torch.Tensor, w: NF4Weight, backend: NF4Backend) -> torch.Tensor:
    """Differentiable `x @ W^T` for an NF4 weight."""
    return NF4Matmul.apply(x, w, backend)

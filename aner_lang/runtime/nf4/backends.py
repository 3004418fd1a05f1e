"""NF4 matmul backends, which one a computation uses, and the autograd Function over them.

A backend computes `linear(x, w) = x @ W^T` and `grad_input(grad_y, w) = grad_y @ W` for an
`NF4Weight`, and names itself with an identity string (what a checkpoint records). The frozen
base has no weight gradient, so the autograd Function saves no activations at all: backward needs
only the packed weight. `host_tiled` (pure torch, CPU and CUDA) is built in; `fused` (NVRTC CUDA
kernels) is loaded on first use so that machines without CuPy never import it.

Which backend runs is never state of the (shared) base model. `resolve_kernel` is the one rule
turning a profile's `kernel` into a backend name for a device; a run enters `using_backend` for
its duration, and every NF4 matmul inside takes that backend (`active_backend`). Outside any run
(generation, evaluation) the rule's `auto` applies. So two adapters of one base, trained with
different kernels, never see each other's choice.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from functools import cache
from typing import Any, Protocol, cast

import torch

from aner_lang.builtins import members
from aner_lang.problems.errors import AnerRuntimeError
from aner_lang.runtime.model.sections import section
from aner_lang.runtime.nf4 import host_tiled
from aner_lang.runtime.nf4.quant import NF4Weight, dequantize_nf4

KERNELS = members("Kernel")


class NF4Backend(Protocol):
    """What a kernel path provides."""

    name: str

    def linear(self, x: torch.Tensor, w: NF4Weight) -> torch.Tensor: ...

    def linear_adds_in_place(self, x: torch.Tensor, w: NF4Weight) -> bool:
        """Whether `add_linear(x, w, into)` adds in its GEMM (no product tensor, no addition)."""
        ...

    def add_linear(self, x: torch.Tensor, w: NF4Weight, into: torch.Tensor) -> torch.Tensor:
        """`into += x @ W^T` (`into` of x's dtype), returned."""
        ...

    def grad_input(self, grad_y: torch.Tensor, w: NF4Weight) -> torch.Tensor: ...

    def grad_adds_in_place(self, grad_y: torch.Tensor, w: NF4Weight) -> bool:
        """Whether `add_grad_input(grad_y, w, into)` adds in its GEMM."""
        ...

    def add_grad_input(
        self, grad_y: torch.Tensor, w: NF4Weight, into: torch.Tensor
    ) -> torch.Tensor:
        """`into += grad_y @ W` (`into` of grad_y's dtype), returned."""
        ...

    def dense(self, w: NF4Weight, dtype: torch.dtype) -> torch.Tensor:
        """The dense `[out, in]` weight in ``dtype``, valid until this backend's next call (it may
        live in a reused buffer): what a grouped GEMM over experts multiplies by."""
        ...

    def identity(self, device: torch.device, dtype: torch.dtype) -> str:
        """What produced a result bit for bit: the kernel's name and version, its source or
        options, and the compute dtype of ``dtype`` inputs on ``device``."""
        ...


class HostTiled:
    """Dequantize bounded tiles into a reused buffer, then matmul (see host_tiled.py)."""

    name = "host_tiled"

    def __init__(self, tile_bytes: int = host_tiled.DEFAULT_TILE_BYTES) -> None:
        self.tile_bytes = tile_bytes

    def linear(self, x: torch.Tensor, w: NF4Weight) -> torch.Tensor:
        return host_tiled.linear(x, w, self.tile_bytes)

    def linear_adds_in_place(self, x: torch.Tensor, w: NF4Weight) -> bool:
        return False  # its tiles' products go through a buffer of their own

    def add_linear(self, x: torch.Tensor, w: NF4Weight, into: torch.Tensor) -> torch.Tensor:
        return into.add_(self.linear(x, w))

    def grad_input(self, grad_y: torch.Tensor, w: NF4Weight) -> torch.Tensor:
        return host_tiled.grad_input(grad_y, w, self.tile_bytes)

    def grad_adds_in_place(self, grad_y: torch.Tensor, w: NF4Weight) -> bool:
        return False

    def add_grad_input(
        self, grad_y: torch.Tensor, w: NF4Weight, into: torch.Tensor
    ) -> torch.Tensor:
        return into.add_(self.grad_input(grad_y, w))

    def dense(self, w: NF4Weight, dtype: torch.dtype) -> torch.Tensor:
        return dequantize_nf4(w, dtype)

    def identity(self, device: torch.device, dtype: torch.dtype) -> str:
        # The tile size is part of it: it sets the shapes of the matmuls the tiles go through.
        compute = str(dtype).removeprefix("torch.")
        return f"aner.nf4.host_tiled/1;tile_bytes={self.tile_bytes};compute={compute}"


def resolve_kernel(kernel: str, device: torch.device) -> str:
    """The backend name `kernel` means on `device`: `auto` is fused on a CUDA device where the
    kernels can run (CUDA visible and CuPy installed) and host_tiled everywhere else; `fused`
    where it cannot run is a clear error, never a silent fallback."""
    from aner_lang.runtime.nf4.fused.availability import require_fused, unavailable_reason

    if kernel not in KERNELS:
        raise AnerRuntimeError(
            f"unknown NF4 kernel {kernel!r}; expected one of {', '.join(KERNELS)}",
            code="E-KERNEL-UNKNOWN",
        )
    if kernel == "auto":
        fused_runs = device.type == "cuda" and unavailable_reason() is None
        return "fused" if fused_runs else "host_tiled"
    if kernel == "fused":
        if device.type != "cuda":
            raise AnerRuntimeError(
                f"kernel: fused needs a CUDA GPU, but this model is on {device.type}",
                code="E-KERNEL-UNAVAILABLE",
                notes=("use kernel: host_tiled, or kernel: auto to pick host_tiled here",),
            )
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


_ACTIVE: ContextVar[NF4Backend | None] = ContextVar("aner_nf4_backend", default=None)


@contextmanager
def using_backend(backend: NF4Backend) -> Iterator[None]:
    """Every NF4 matmul in this context (of this thread or task) runs on `backend`."""
    token = _ACTIVE.set(backend)
    try:
        yield
    finally:
        _ACTIVE.reset(token)


def active_backend(device: torch.device) -> NF4Backend:
    """The backend of the enclosing `using_backend`, else what `auto` means on `device`."""
    backend = _ACTIVE.get()
    return backend if backend is not None else get_backend(resolve_kernel("auto", device))


class NF4Matmul(torch.autograd.Function):
    """y = x @ W^T through a backend; gradient flows to x only (the NF4 base is frozen).

    The backward runs outside autocast, in the gradient's dtype, which is the residual stream's:
    the half dtype under a half-precision profile (tensor cores, fp32 accumulation), float32
    under `precision: float32` (the reference arithmetic). The error this costs against the fp32
    path is bounded by a test from the operands' rounding."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, w: NF4Weight, backend: NF4Backend) -> torch.Tensor:
        ctx.w, ctx.backend = w, backend
        with section("nf4_forward"):
            return _unviewed(backend.linear(x, w))

    @staticmethod
    def backward(ctx: Any, grad_y: torch.Tensor) -> tuple[torch.Tensor | None, None, None]:
        if not ctx.needs_input_grad[0]:
            return None, None, None
        with section("nf4_backward"):
            return ctx.backend.grad_input(grad_y.contiguous(), ctx.w), None, None


def _unviewed(t: torch.Tensor) -> torch.Tensor:
    """`t` as a tensor of its own over the same memory, where it is a view of the kernel's buffer.
    Rule: a custom Function's output must not be a view created inside it, or autograd refuses
    in-place changes to it, and a LoRA adds its product into the base output in place."""
    if t._base is None:
        return t
    own = torch.empty(0, dtype=t.dtype, device=t.device)
    return own.set_(t.untyped_storage(), t.storage_offset(), t.size(), t.stride())


def nf4_matmul(x: torch.Tensor, w: NF4Weight, backend: NF4Backend) -> torch.Tensor:
    """Differentiable `x @ W^T` for an NF4 weight."""
    return cast(torch.Tensor, NF4Matmul.apply(x, w, backend))

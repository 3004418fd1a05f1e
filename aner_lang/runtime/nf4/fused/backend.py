"""The "fused" NF4Backend: NF4's backend protocol (``linear(x, w)``, ``grad_input(grad_y, w)``)
served by the NVRTC kernels in ``ops``, behind the same autograd Function as host_tiled.

Creating the backend checks that CUDA and CuPy are there and fails with one clear error where
they are not (``kernel: auto`` never gets here without CUDA: it picks host_tiled).
"""

from __future__ import annotations

import torch

from aner_lang.problems.errors import AnerRuntimeError
from aner_lang.runtime.model.precision import compute_dtype
from aner_lang.runtime.nf4.fused import compiler, ops
from aner_lang.runtime.nf4.fused.availability import require_fused
from aner_lang.runtime.nf4.quant import NF4Weight

_PRECISION = {torch.float32: "float32", torch.float16: "float16", torch.bfloat16: "bfloat16"}


def nf4_tensors(w: NF4Weight) -> ops.NF4Tensors:
    """The kernels' view of an NF4Weight (no copy, no host sync), checked and packed once per
    weight: kept in ``w.views`` and reused while the tensors still live where it points (a deep
    copy of a module copies the view too, with the old pointers)."""
    view = w.views.get("fused")
    if view is None or not view.points_at(w.packed, w.qabsmax, w.code2, w.absmax2, w.offset):
        if w.blocksize != 64:
            raise AnerRuntimeError(
                f"fused NF4 kernels support blocksize 64, this weight has {w.blocksize}",
                code="E-KERNEL-SHAPE",
                notes=("use kernel: host_tiled",),
            )
        view = w.views["fused"] = ops.NF4Tensors(
            w.packed, w.qabsmax, w.code2, w.absmax2, w.offset.reshape(1), w.shape[0], w.shape[1]
        )
    return view


class FusedBackend:
    """NF4 matmuls on CUDA through the fused kernels (see ``ops`` for which path each shape takes)."""

    name = "fused"

    def __init__(self) -> None:
        require_fused()

    def linear(self, x: torch.Tensor, w: NF4Weight) -> torch.Tensor:
        # Computed in the autocast dtype, returned in x's dtype as host_tiled does: the kernels
        # write it from their fp32 accumulators, so an fp32 input never sees a 16-bit product.
        return ops.linear(x.to(compute_dtype(x)), nf4_tensors(w), out_dtype=x.dtype)

    def linear_adds_in_place(self, x: torch.Tensor, w: NF4Weight) -> bool:
        m = x.numel() // max(x.shape[-1], 1)
        return x.dtype == compute_dtype(x) and ops.linear_adds_in_place(
            m, x.dtype, x.device, *w.shape
        )

    def add_linear(self, x: torch.Tensor, w: NF4Weight, into: torch.Tensor) -> torch.Tensor:
        return ops.add_linear(x.to(compute_dtype(x)), nf4_tensors(w), into)

    def grad_input(self, grad_y: torch.Tensor, w: NF4Weight) -> torch.Tensor:
        return ops.grad_input(grad_y, nf4_tensors(w))  # outside autocast: in the gradient's dtype

    def grad_adds_in_place(self, grad_y: torch.Tensor, w: NF4Weight) -> bool:
        m = grad_y.numel() // max(grad_y.shape[-1], 1)
        return ops.grad_adds_in_place(m, w.shape[0], grad_y.dtype)

    def add_grad_input(
        self, grad_y: torch.Tensor, w: NF4Weight, into: torch.Tensor
    ) -> torch.Tensor:
        return ops.add_grad_input(grad_y, nf4_tensors(w), into)

    def dense(self, w: NF4Weight, dtype: torch.dtype) -> torch.Tensor:
        return ops.dequantize(nf4_tensors(w), dtype, reuse=True)

    def identity(self, device: torch.device, dtype: torch.dtype = torch.float32) -> str:
        """The kernel identity string for computations in ``dtype`` on ``device``."""
        index = device.index if device.index is not None else torch.cuda.current_device()
        return compiler.kernel_identity(compiler.load(index).arch, _PRECISION[dtype])

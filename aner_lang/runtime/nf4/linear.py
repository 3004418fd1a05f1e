"""`NF4Linear`: a frozen weight stored as double-quantized NF4 (the QLoRA base).

The packed tensors are registered as buffers so `.to(device)` moves them and they never appear
among parameters (nothing here is trainable). Which kernel computes the matmul is not the
module's business: it asks `active_backend` (the run's backend, see `backends`), so one quantized
base serves host_tiled and fused runs alike, at once.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from aner_lang.runtime.model.activations import product_needed
from aner_lang.runtime.model.experts import holds_slices, joined
from aner_lang.runtime.model.linear import FrozenLinear
from aner_lang.runtime.model.sections import section
from aner_lang.runtime.nf4 import host_tiled
from aner_lang.runtime.nf4.backends import active_backend, nf4_matmul
from aner_lang.runtime.nf4.quant import (
    NESTED_BLOCKSIZE,
    NF4Weight,
    dequantize_nf4,
    quantize_nf4,
)

_PARTS = ("packed", "qabsmax", "absmax2", "code2", "offset")


class NF4Linear(FrozenLinear):
    """A frozen `[out, in]` weight kept as NF4 + double quantization (0.127 bit/param of stats)."""

    storage = "nf4_double_quant"

    def __init__(self, weight: NF4Weight) -> None:
        super().__init__(weight.shape[1], weight.shape[0])
        for part in _PARTS:
            self.register_buffer(part, getattr(weight, part))
        self.blocksize = weight.blocksize
        self._nf4: NF4Weight | None = None

    @classmethod
    def from_dense(cls, weight: torch.Tensor) -> NF4Linear:
        return cls(quantize_nf4(weight))

    @property
    def weight_nf4(self) -> NF4Weight:
        """The current tensors (wherever the module now lives) as an `NF4Weight`: the same object
        while the buffers are the same tensors, so what a backend derives from it is built once
        (every forward asks)."""
        parts = [self.get_buffer(p) for p in _PARTS]
        w = self._nf4
        if w is None or any(a is not getattr(w, p) for a, p in zip(parts, _PARTS)):
            packed, qabsmax, absmax2, code2, offset = parts
            shape = (self.out_features, self.in_features)
            w = self._nf4 = NF4Weight(
                packed, qabsmax, absmax2, code2, offset, shape=shape, blocksize=self.blocksize
            )
        return w

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not product_needed(self):
            return self.unread(x)
        return nf4_matmul(x, self.weight_nf4, active_backend(x.device))

    def adds_product(self, x: torch.Tensor) -> bool:
        return active_backend(x.device).linear_adds_in_place(x, self.weight_nf4)

    def add_product(self, x: torch.Tensor, into: torch.Tensor) -> torch.Tensor:
        if not product_needed(self):
            return into
        with section("nf4_forward"):
            return active_backend(x.device).add_linear(x, self.weight_nf4, into)

    def dense_weight(self, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        return dequantize_nf4(self.weight_nf4, dtype)

    def grad_input(self, grad_y: torch.Tensor) -> torch.Tensor:
        return active_backend(grad_y.device).grad_input(grad_y.contiguous(), self.weight_nf4)

    def adds_grad_input(self, grad_y: torch.Tensor) -> bool:
        return active_backend(grad_y.device).grad_adds_in_place(grad_y, self.weight_nf4)

    def add_grad_input(self, grad_y: torch.Tensor, into: torch.Tensor) -> torch.Tensor:
        backend = active_backend(grad_y.device)
        return backend.add_grad_input(grad_y.contiguous(), self.weight_nf4, into)

    def rows(self, ids: torch.Tensor) -> torch.Tensor:
        return host_tiled.rows(self.weight_nf4, ids)

    def nbytes(self) -> dict[str, int]:
        return {"packed_base": self.weight_nf4.packed_nbytes()}


class NF4ExpertGroup:
    """Experts whose NF4 weights are slices of one weight quantized over all of them."""

    def __init__(self, joint: NF4Weight, experts: int) -> None:
        self.joint, self.experts = joint, experts

    def stack(self, dtype: torch.dtype) -> torch.Tensor:
        rows, cols = self.joint.shape
        dense = active_backend(self.joint.packed.device).dense(self.joint, dtype)
        return dense.view(self.experts, rows // self.experts, cols)

    def holds(self, modules: Sequence[FrozenLinear]) -> bool:
        return holds_slices(modules, NF4Linear, "packed", self.joint.packed, self.experts)


def nf4_experts(weights: torch.Tensor) -> list[NF4Linear]:
    """E experts ``[E, out, in]`` as `NF4Linear` modules.

    Rule: where each expert fills whole 256-block groups of the double quantization
    (``out * in`` a multiple of 64 * 256, every real MoE shape), the experts are quantized as one
    ``[E * out, in]`` weight, as a 3-D expert tensor is stored, and each module holds its slice:
    the same 4-bit codes and block absmax values as quantizing it alone, the double
    quantization's offset taken over all the experts. One dequantization then gives a grouped GEMM
    its whole ``[E, out, in]`` stack. Other shapes are quantized expert by expert, and stacked per
    use."""
    count, rows, cols = weights.shape
    per = rows * cols
    if per % (64 * NESTED_BLOCKSIZE):
        return [NF4Linear.from_dense(w) for w in weights]
    joint = quantize_nf4(weights.reshape(count * rows, cols))
    blocks, groups = per // 64, per // (64 * NESTED_BLOCKSIZE)
    parts = [
        NF4Weight(
            joint.packed[e * per // 2 : (e + 1) * per // 2],
            joint.qabsmax[e * blocks : (e + 1) * blocks],
            joint.absmax2[e * groups : (e + 1) * groups],
            joint.code2,
            joint.offset,
            (rows, cols),
            joint.blocksize,
        )
        for e in range(count)
    ]
    return joined([NF4Linear(p) for p in parts], NF4ExpertGroup(joint, count))

"""`GGUFLinear`: a frozen weight kept as the GGUF file's own quantized blocks (`storage: gguf`).

The blocks are a registered buffer, so `.to(device)` moves them and they are never parameters.
The matmul follows the NF4 backend rule (`nf4.backends`): the run's backend decides. `fused` is
the NVRTC kernels of `ggml.fused` (CUDA with CuPy, which `auto` picks there); `host_tiled`
dequantizes bounded row tiles in torch, then multiplies (CPU and CUDA).
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import cache
from typing import Protocol

import torch

from aner_lang.runtime.ggml.weight import GGUFWeight
from aner_lang.runtime.model.activations import product_needed
from aner_lang.runtime.model.experts import holds_slices, joined
from aner_lang.runtime.model.linear import FrozenLinear
from aner_lang.runtime.nf4 import host_tiled
from aner_lang.runtime.nf4.backends import NF4Backend, NF4Matmul, active_backend

STORAGE = "gguf"


class GGUFBackend(Protocol):
    """What a GGUF matmul path provides (the NF4 backend protocol over `GGUFWeight`)."""

    name: str

    def linear(self, x: torch.Tensor, w: GGUFWeight) -> torch.Tensor: ...

    def grad_input(self, grad_y: torch.Tensor, w: GGUFWeight) -> torch.Tensor: ...

    def dense(self, w: GGUFWeight, dtype: torch.dtype) -> torch.Tensor:
        """The dense `[out, in]` weight (`NF4Backend.dense`)."""
        ...

    def identity(self, device: torch.device, dtype: torch.dtype) -> str: ...


class GGUFHostTiled:
    """The host_tiled path for GGUF blocks: `nf4.host_tiled`'s tile loops over `GGUFWeight.tiles`."""

    name = "host_tiled"

    def __init__(self, tile_bytes: int = host_tiled.DEFAULT_TILE_BYTES) -> None:
        self.tile_bytes = tile_bytes

    def linear(self, x: torch.Tensor, w: GGUFWeight) -> torch.Tensor:
        return host_tiled.tiled_linear(x, w.shape, lambda dt: w.tiles(dt, self.tile_bytes))

    def grad_input(self, grad_y: torch.Tensor, w: GGUFWeight) -> torch.Tensor:
        return host_tiled.tiled_grad_input(grad_y, w.shape, lambda dt: w.tiles(dt, self.tile_bytes))

    def dense(self, w: GGUFWeight, dtype: torch.dtype) -> torch.Tensor:
        return w.rows(0, w.shape[0]).to(dtype)

    def identity(self, device: torch.device, dtype: torch.dtype) -> str:
        compute = str(dtype).removeprefix("torch.")
        return f"aner.gguf.host_tiled/1;tile_bytes={self.tile_bytes};compute={compute}"


def gguf_backend(backend: NF4Backend) -> GGUFBackend:
    """The GGUF path a run's NF4 backend stands for: the fused GGUF kernels for `fused`, else
    host_tiled with the backend's tile budget."""
    if backend.name == "fused":
        return _fused()
    return GGUFHostTiled(getattr(backend, "tile_bytes", host_tiled.DEFAULT_TILE_BYTES))


@cache
def _fused() -> GGUFBackend:
    from aner_lang.runtime.ggml.fused import GGUFFused  # CuPy only where the kernels run

    return GGUFFused()


class GGUFLinear(FrozenLinear):
    """A frozen `[out, in]` weight held as the GGUF file's blocks of one GGML type."""

    storage = STORAGE

    def __init__(self, weight: GGUFWeight) -> None:
        super().__init__(weight.shape[1], weight.shape[0])
        self.register_buffer("raw", weight.raw)
        self.qtype = weight.qtype

    @property
    def weight_gguf(self) -> GGUFWeight:
        """The blocks wherever the module now lives."""
        return GGUFWeight(self.get_buffer("raw"), self.qtype, (self.out_features, self.in_features))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not product_needed(self):
            return self.unread(x)
        out: torch.Tensor = NF4Matmul.apply(
            x, self.weight_gguf, gguf_backend(active_backend(x.device))
        )
        return out

    def dense_weight(self, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        w = self.weight_gguf
        return w.rows(0, w.shape[0]).to(dtype)

    def grad_input(self, grad_y: torch.Tensor) -> torch.Tensor:
        return gguf_backend(active_backend(grad_y.device)).grad_input(
            grad_y.contiguous(), self.weight_gguf
        )

    def rows(self, ids: torch.Tensor) -> torch.Tensor:
        """Embedding lookup: gathers the byte rows of `ids` and dequantizes only those."""
        w = self.weight_gguf
        flat = ids.reshape(-1)
        return w.take(w.raw[flat]).reshape(*ids.shape, w.shape[1])

    def nbytes(self) -> dict[str, int]:
        return {"packed_base": self.weight_gguf.nbytes()}

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, qtype={self.qtype}"


class GGUFExpertGroup:
    """Experts whose blocks are row slices of one `[experts * out, row_bytes]` tensor."""

    def __init__(self, joint: GGUFWeight, experts: int) -> None:
        self.joint, self.experts = joint, experts

    def stack(self, dtype: torch.dtype) -> torch.Tensor:
        rows, cols = self.joint.shape
        backend = gguf_backend(active_backend(self.joint.raw.device))
        return backend.dense(self.joint, dtype).view(self.experts, rows // self.experts, cols)

    def holds(self, modules: Sequence[FrozenLinear]) -> bool:
        return holds_slices(modules, GGUFLinear, "raw", self.joint.raw, self.experts)


def gguf_experts(weights: list[GGUFWeight]) -> list[GGUFLinear]:
    """One projection's experts of one layer (blocks of one type, as their 3-D GGUF tensor
    holds them) as `GGUFLinear` modules over row slices of one tensor, the file's bytes
    unchanged: a grouped GEMM decodes all of them at once (`GGUFExpertGroup`)."""
    joint = GGUFWeight(
        torch.cat([w.raw for w in weights]),
        weights[0].qtype,
        (sum(w.shape[0] for w in weights), weights[0].shape[1]),
    )
    rows = weights[0].shape[0]
    experts = [
        GGUFLinear(GGUFWeight(joint.raw[e * rows : (e + 1) * rows], w.qtype, w.shape))
        for e, w in enumerate(weights)
    ]
    return joined(experts, GGUFExpertGroup(joint, len(weights)))

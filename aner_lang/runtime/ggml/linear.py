"""`GGUFLinear`: a frozen weight kept as the GGUF file's own quantized blocks (`storage: gguf`).

The blocks are a registered buffer, so `.to(device)` moves them and they are never parameters.
The matmul follows the NF4 backend rule (`nf4.backends`): the run's backend decides, and for a
GGUF base `host_tiled` (dequantize bounded row tiles, then matmul; pure torch, CPU and CUDA) is
the one that exists. `auto` therefore means host_tiled on every device; `kernel: fused` with a
GGUF base is refused when training starts (`require_kernel`), never silently replaced.
"""

from __future__ import annotations

import torch

from aner_lang.problems.errors import AnerRuntimeError
from aner_lang.runtime.ggml.weight import GGUFWeight
from aner_lang.runtime.model.linear import FrozenLinear
from aner_lang.runtime.nf4 import host_tiled
from aner_lang.runtime.nf4.backends import NF4Backend, NF4Matmul, active_backend

STORAGE = "gguf"


class GGUFHostTiled:
    """The host_tiled path for GGUF blocks: `nf4.host_tiled`'s tile loops over `GGUFWeight.tiles`."""

    name = "host_tiled"

    def __init__(self, tile_bytes: int = host_tiled.DEFAULT_TILE_BYTES) -> None:
        self.tile_bytes = tile_bytes

    def linear(self, x: torch.Tensor, w: GGUFWeight) -> torch.Tensor:
        return host_tiled.tiled_linear(x, w.shape, lambda dt: w.tiles(dt, self.tile_bytes))

    def grad_input(self, grad_y: torch.Tensor, w: GGUFWeight) -> torch.Tensor:
        return host_tiled.tiled_grad_input(grad_y, w.shape, lambda dt: w.tiles(dt, self.tile_bytes))

    def identity(self, device: torch.device, dtype: torch.dtype) -> str:
        compute = str(dtype).removeprefix("torch.")
        return f"aner.gguf.host_tiled/1;tile_bytes={self.tile_bytes};compute={compute}"


def gguf_backend(backend: NF4Backend) -> GGUFHostTiled:
    """The GGUF path a run's NF4 backend stands for: its tile budget where it is host_tiled, the
    default budget where `auto` picked fused (no fused GGUF kernels exist)."""
    return GGUFHostTiled(getattr(backend, "tile_bytes", host_tiled.DEFAULT_TILE_BYTES))


def require_kernel(kernel: str) -> None:
    """Refuse `kernel: fused` for a GGUF base (the backend rule: never a silent fallback)."""
    if kernel == "fused":
        raise AnerRuntimeError(
            "kernel: fused has no kernels for storage: gguf (its blocks are matmul'd by "
            "host_tiled on every device)",
            code="E-KERNEL-UNAVAILABLE",
            notes=("use kernel: auto or kernel: host_tiled with a storage: gguf base",),
        )


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

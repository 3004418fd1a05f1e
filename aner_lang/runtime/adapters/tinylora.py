"""TinyLoRA (Morris et al. 2026, arXiv 2602.04118; research/training.md section 5).

For every target W = U S V^T (truncated to `rank`, from the unquantized weight):
`W' = W + U S R V^T` with `R = sum_i v_i P_i`. We use the paper's placement of S (not PEFT's
sqrt(S) split) and no extra scaling. `v` (length `parameters`) is the only trainable tensor: one
shared by all targets (`sharing: global`, 13 numbers for the headline) or one per target
(`per_module`). U, S, V^T and the fixed random projections P (target t drawn from
`seed + t`, N(0, 1/rank)) are stored in the adapter, never recomputed, because SVD signs differ
across LAPACK/cuSOLVER versions and bit-exact resume needs the same bases.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from aner_lang.runtime.adapters.base import Adapter, target_modules


def _unquantized_weights(model, targets) -> list[torch.Tensor]:
    """fp32 target weights before any NF4 quantization (re-read from the model's file or folder
    through its `TensorSource` if needed)."""
    if all(m.storage in ("float32", "float16") for _, m in targets):
        return [m.dense_weight() for _, m in targets]
    from aner_lang.runtime.io.source import open_source

    source, _ = open_source(model.path)
    c = model.config
    weights = {
        w.name: w for w in model.architecture.weights(c.num_hidden_layers, True, c.experts_in)
    }
    cpu = torch.device("cpu")
    return [source.read(weights[name], c, torch.float32, cpu) for name, _ in targets]


class TinyLoRA(Adapter):
    """A handful of trainable numbers steering fixed SVD bases of every target."""

    method = "tinylora"

    def __init__(
        self, model, parameters: int, sharing: str, rank: int, targets: list[str], seed: int
    ) -> None:
        super().__init__(
            model,
            {
                "method": self.method,
                "parameters": parameters,
                "sharing": sharing,
                "rank": rank,
                "targets": list(targets),
                "seed": seed,
            },
        )
        self.targets = target_modules(model, targets)
        dev = model.device
        self._bases: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]] = []
        self._v: list[torch.Tensor] = []
        shared = torch.zeros(parameters, device=dev, requires_grad=True)
        if sharing == "global":
            self.params["tinylora.v"] = shared
        for t, ((name, _), w) in enumerate(
            zip(self.targets, _unquantized_weights(model, self.targets))
        ):
            u, s, vh = torch.linalg.svd(w.float(), full_matrices=False)
            gen = torch.Generator().manual_seed(seed + t)
            proj = torch.randn(parameters, rank, rank, generator=gen) / rank**0.5
            parts = (u[:, :rank].contiguous(), s[:rank].contiguous(), vh[:rank].contiguous(), proj)
            for key, tensor in zip(("U", "S", "Vh", "P"), parts):
                self.frozen[f"{name}.tinylora_{key}"] = tensor.to(dev)
            stored = [self.frozen[f"{name}.tinylora_{k}"] for k in ("U", "S", "Vh", "P")]
            self._bases.append((stored[0], stored[1], stored[2], stored[3]))
            if sharing == "global":
                self._v.append(shared)
            else:
                v = torch.zeros(parameters, device=dev, requires_grad=True)
                self.params[f"{name}.tinylora_v"] = v
                self._v.append(v)

    def _delta(self, index: int, x: torch.Tensor) -> torch.Tensor:
        u, s, vh, proj = self._bases[index]
        r = torch.einsum("i,ijk->jk", self._v[index], proj)
        h = F.linear(x, vh.to(x.dtype))  # tokens x rank
        z = F.linear(h, r.to(x.dtype)) * s.to(x.dtype)  # S R V^T x
        return F.linear(z, u.to(x.dtype))

"""Compute precision and loss scaling.

Masters are always fp32; `float16`/`bfloat16` run the forward under `torch.autocast`. Loss
scaling replicates `torch.amp.GradScaler` exactly (research/training.md section 7): the scale is
fp32, the growth tracker an int, the unscale multiplies by `float32(1 / float64(scale))`, an
overflow skips the update and multiplies the scale by `backoff_factor`, and growth happens after
`growth_interval` consecutive good updates. Our addition is `max_retries`: the trainer re-runs
the same accumulation window with the backed-off scale up to that many times before counting the
update as skipped.
"""

from __future__ import annotations

from contextlib import nullcontext
from dataclasses import asdict, dataclass
from typing import ContextManager, Iterable

import torch

from aner_lang.errors import AnerRuntimeError

DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}


def autocast(precision: str, device: torch.device) -> ContextManager:
    """The forward-pass context for `precision` on `device` (no-op for float32)."""
    if precision == "float32":
        return nullcontext()
    return torch.autocast(device_type=device.type, dtype=DTYPES[precision])


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


def check_precision_supported(precision: str, device: torch.device) -> None:
    """Reject a precision this device cannot run, before any training starts."""
    if precision == "float32":
        return
    dtype = DTYPES[precision]
    if not torch.amp.is_autocast_available(device.type):
        raise AnerRuntimeError(f"precision: {precision} needs autocast, which {device.type} lacks",
                               code="E-PRECISION", notes=("use precision: float32",))
    if device.type == "cuda" and dtype == torch.bfloat16 and not torch.cuda.is_bf16_supported():
        raise AnerRuntimeError("precision: bfloat16 is not supported by this GPU",
                               code="E-PRECISION", notes=("use precision: float16 or float32",))
    try:
        a = torch.ones(2, 2, dtype=dtype, device=device)
        (a @ a).sum().item()
    except RuntimeError as exc:
        raise AnerRuntimeError(f"precision: {precision} matmul is not supported on "
                               f"{device.type}: {exc}", code="E-PRECISION",
                               notes=("use precision: float32",)) from None


@dataclass
class LossScaleState:
    """Everything of a loss scaler that must survive a checkpoint."""

    kind: str  # "dynamic", "fixed" or "none"
    scale: float = 1.0
    growth_tracker: int = 0
    growth_factor: float = 2.0
    backoff_factor: float = 0.5
    growth_interval: int = 2000
    max_retries: int = 0
    overflows: int = 0
    growths: int = 0


class LossScaler:
    """GradScaler semantics over fp32 master gradients."""

    def __init__(self, state: LossScaleState) -> None:
        self.state = state

    @property
    def enabled(self) -> bool:
        return self.state.kind != "none"

    def scale(self, loss: torch.Tensor) -> torch.Tensor:
        if not self.enabled:
            return loss
        return loss * torch.tensor(self.state.scale, dtype=torch.float32, device=loss.device)

    @torch.no_grad()
    def unscale_(self, grads: Iterable[torch.Tensor]) -> bool:
        """Unscale gradients in place; True when any of them is non-finite (an overflow).

        GradScaler's own fused kernel (one launch per device and dtype, one host sync in all),
        with its inverse scale float32(1 / float64(scale)); without scaling the inverse is 1,
        which leaves every value as it is and still finds the non-finite ones."""
        inv = float(torch.tensor(1.0 / float(self.state.scale), dtype=torch.float32)) if self.enabled else 1.0
        groups: dict[tuple[torch.device, torch.dtype], list[torch.Tensor]] = {}
        for g in grads:
            groups.setdefault((g.device, g.dtype), []).append(g)
        found = []
        for (device, _), group in groups.items():
            found.append(torch.zeros(1, dtype=torch.float32, device=device))
            torch._amp_foreach_non_finite_check_and_unscale_(
                group, found[-1], torch.tensor(inv, dtype=torch.float32, device=device))
        return any(bool(f.item()) for f in found)  # read once every group's check is queued

    def update(self, found_inf: bool) -> None:
        """GradScaler.update: back off on overflow, grow after growth_interval good updates."""
        st = self.state
        if st.kind != "dynamic":
            if found_inf:
                st.overflows += 1
            return
        if found_inf:
            st.scale = float(torch.tensor(st.scale * st.backoff_factor, dtype=torch.float32))
            st.growth_tracker = 0
            st.overflows += 1
            return
        successful = st.growth_tracker + 1
        if successful == st.growth_interval:
            new = float(torch.tensor(st.scale * st.growth_factor, dtype=torch.float32))
            if torch.isfinite(torch.tensor(new)):
                st.scale = new
                st.growths += 1
            st.growth_tracker = 0
        else:
            st.growth_tracker = successful

    def to_json(self) -> dict:
        return asdict(self.state)

    @classmethod
    def from_json(cls, data: dict) -> LossScaler:
        return cls(LossScaleState(**data))

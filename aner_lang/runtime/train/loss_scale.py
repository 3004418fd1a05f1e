"""Loss scaling for float16 training, with `torch.amp.GradScaler`'s exact semantics.

Replicates GradScaler (research/training.md section 7): the scale is fp32, the growth tracker an
int, the unscale multiplies by `float32(1 / float64(scale))`, an overflow skips the update and
multiplies the scale by `backoff_factor`, and growth happens after `growth_interval` consecutive
good updates. Our addition is `max_retries`: the trainer re-runs the same accumulation window with
the backed-off scale up to that many times before counting the update as skipped.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import asdict, dataclass

import torch

from aner_lang.interp.values import record_fields


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

    def __str__(self) -> str:
        """The Aner `LossScale` it is, with a dynamic scaler's settings (not its counters)."""
        pairs: list[tuple[str, object]] = [("kind", self.kind), ("scale", self.scale)]
        if self.kind == "dynamic":
            pairs += [
                ("growth_interval", self.growth_interval),
                ("growth_factor", self.growth_factor),
                ("backoff_factor", self.backoff_factor),
            ]
        return record_fields("LossScale", pairs)


class LossScaler:
    """GradScaler semantics over fp32 master gradients."""

    def __init__(self, state: LossScaleState) -> None:
        self.state = state

    @property
    def enabled(self) -> bool:
        return self.state.kind != "none"

    @torch.no_grad()
    def unscale_(self, grads: Iterable[torch.Tensor]) -> torch.Tensor:
        """Unscale gradients in place; returns a 0-d fp32 tensor, non-zero when any of them is
        non-finite (an overflow). Not read here: the trainer reads it together with the loss, in
        the update's one host synchronisation.

        GradScaler's own fused kernel (one launch per device and dtype), with its inverse scale
        float32(1 / float64(scale)); without scaling the inverse is 1, which leaves every value as
        it is and still finds the non-finite ones."""
        inv = (
            float(torch.tensor(1.0 / float(self.state.scale), dtype=torch.float32))
            if self.enabled
            else 1.0
        )
        groups: dict[tuple[torch.device, torch.dtype], list[torch.Tensor]] = {}
        for g in grads:
            groups.setdefault((g.device, g.dtype), []).append(g)
        found: torch.Tensor | None = None
        for (device, _), group in groups.items():
            flag = torch.zeros(1, dtype=torch.float32, device=device)
            inv_t = torch.full((), inv, dtype=torch.float32, device=device)  # no host copy
            torch._amp_foreach_non_finite_check_and_unscale_(group, flag, inv_t)
            found = flag.sum() if found is None else found.to(device) + flag.sum()
        return torch.zeros((), dtype=torch.float32) if found is None else found

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

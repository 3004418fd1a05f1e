"""AdamW on fp32 master tensors, bit-identical to `torch.optim.AdamW(foreach=True)`.

We keep our own loop instead of wrapping `torch.optim.AdamW` because the trainer needs the state
as plain named tensors (for exact checkpoints) and paged AdamW swaps where the moments live. The
arithmetic is torch's multi-tensor path op for op (research/training.md 7.4): a few
`torch._foreach_*` launches per update for all tensors instead of eight per tensor (the host cost
of an update of hundreds of LoRA tensors). On the CPU it also equals torch's single-tensor path
bit for bit; on CUDA the two paths' kernels may round differently, so every optimizer here
(`PagedAdamW` included) uses the multi-tensor form.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from aner_lang.runtime.io.host_copy import host_copies


@dataclass
class AdamWState:
    """Moments and step count of one tensor; `step` is a 0-d fp32 CPU tensor, as in torch."""

    exp_avg: torch.Tensor
    exp_avg_sq: torch.Tensor
    step: torch.Tensor


class AdamW:
    """Decoupled-weight-decay Adam over named fp32 tensors (the masters are updated in place)."""

    kind = "adamw"

    def __init__(
        self,
        params: dict[str, torch.Tensor],
        lr: float = 1e-3,
        betas: tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-8,
        weight_decay: float = 1e-2,
    ) -> None:
        self.params = params
        self.lr, self.betas, self.eps, self.weight_decay = lr, betas, eps, weight_decay
        self.state: dict[str, AdamWState] = {}

    def _zeros(self, p: torch.Tensor) -> torch.Tensor:
        """Moment storage for `p`; paged AdamW overrides where it lives."""
        return torch.zeros_like(p, memory_format=torch.preserve_format)

    def _state_for(self, name: str, p: torch.Tensor) -> AdamWState:
        if name not in self.state:
            self.state[name] = AdamWState(
                self._zeros(p), self._zeros(p), torch.tensor(0.0, dtype=torch.float32)
            )
        return self.state[name]

    @torch.no_grad()
    def step(self, grads: dict[str, torch.Tensor], lr: float | None = None) -> None:
        """One update of every tensor that has a gradient, in the order of `params`."""
        lr = self.lr if lr is None else lr
        beta1, beta2 = self.betas
        groups: dict[tuple[torch.device, torch.dtype], list[tuple[torch.Tensor, ...]]] = {}
        for name, p in self.params.items():
            grad = grads.get(name)
            if grad is None:
                continue
            st = self._state_for(name, p)
            groups.setdefault((p.device, p.dtype), []).append(
                (p, grad, st.exp_avg, st.exp_avg_sq, st.step)
            )
        for group in groups.values():
            params, grad_list, exp_avgs, exp_avg_sqs, steps = (list(x) for x in zip(*group))
            self._update_group(params, grad_list, exp_avgs, exp_avg_sqs, steps, lr, beta1, beta2)

    def _update_group(
        self,
        params: list[torch.Tensor],
        grads: list[torch.Tensor],
        exp_avgs: list[torch.Tensor],
        exp_avg_sqs: list[torch.Tensor],
        steps: list[torch.Tensor],
        lr: float,
        beta1: float,
        beta2: float,
    ) -> None:
        # torch/optim/adam.py::_multi_tensor_adam, decoupled_weight_decay=True, capturable=False
        torch._foreach_add_(steps, 1)
        torch._foreach_mul_(params, 1 - lr * self.weight_decay)
        torch._foreach_lerp_(exp_avgs, grads, 1 - beta1)
        torch._foreach_mul_(exp_avg_sqs, beta2)
        torch._foreach_addcmul_(exp_avg_sqs, grads, grads, 1 - beta2)
        counts = [s.item() for s in steps]  # CPU tensors: no device synchronisation
        step_size = [(lr / (1 - beta1**n)) * -1 for n in counts]
        bias_correction2_sqrt = [(1 - beta2**n) ** 0.5 for n in counts]
        denom = torch._foreach_sqrt(exp_avg_sqs)
        torch._foreach_div_(denom, bias_correction2_sqrt)
        torch._foreach_add_(denom, self.eps)
        torch._foreach_addcdiv_(params, exp_avgs, denom, step_size)

    def state_tensors(self) -> dict[str, torch.Tensor]:
        """Moments and steps as contiguous CPU tensors, keyed for `TrainState`."""
        out: dict[str, torch.Tensor] = {}
        for name, st in self.state.items():
            out[f"optim/exp_avg/{name}"] = st.exp_avg
            out[f"optim/exp_avg_sq/{name}"] = st.exp_avg_sq
            out[f"optim/step/{name}"] = st.step
        return host_copies(out)

    def load_state_tensors(self, tensors: dict[str, torch.Tensor]) -> None:
        """Inverse of `state_tensors`: moments copied into fresh storage of this optimizer."""
        for name, p in self.params.items():
            key = f"optim/step/{name}"
            if key not in tensors:
                continue
            st = AdamWState(self._zeros(p), self._zeros(p), tensors[key].clone().float().cpu())
            st.exp_avg.copy_(tensors[f"optim/exp_avg/{name}"])
            st.exp_avg_sq.copy_(tensors[f"optim/exp_avg_sq/{name}"])
            self.state[name] = st

    def managed_bytes(self) -> int:
        """Bytes of moments in CUDA managed memory (none for plain AdamW)."""
        return 0

    def report(self) -> str:
        """One line for the profile report."""
        return f"adamw: {self.state_bytes()} bytes of fp32 moments on the parameters' device"

    def state_bytes(self) -> int:
        """Bytes of all optimizer moments."""
        return sum(st.exp_avg.numel() * st.exp_avg.element_size() * 2 for st in self.state.values())

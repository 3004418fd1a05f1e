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


@dataclass
class AdamWState:
    """Moments and step count of one tensor. The count is a Python int: torch keeps it as a 0-d
    fp32 CPU tensor, whose values are these ints exactly (below 2**24 updates), and incrementing
    hundreds of such tensors is host time the GPU waits through (`step` gives torch's form)."""

    exp_avg: torch.Tensor
    exp_avg_sq: torch.Tensor
    count: int

    @property
    def step(self) -> torch.Tensor:
        """The count as torch keeps it: a 0-d fp32 CPU tensor."""
        return torch.tensor(float(self.count), dtype=torch.float32)


@dataclass
class StepGroup:
    """The tensors of one device and dtype that an update steps, by name."""

    names: list[str]
    params: list[torch.Tensor]
    grads: list[torch.Tensor]


@dataclass
class PreparedStep:
    """An update's host-side work done ahead (`AdamW.prepare`): the tensors grouped, and the
    per-tensor scalars for the step counts it would reach. `apply` launches it; a skipped
    update never applies it, and the optimizer stays as it was (a tensor's state is made at its
    first applied step, as in torch)."""

    optimizer: AdamW
    groups: list[StepGroup]
    lr: float
    step_size: list[list[float]]
    bias_correction2_sqrt: list[list[float]]

    def apply(self) -> None:
        """Launch the update (asynchronously on the device) and count it."""
        for group, step_size, correction in zip(
            self.groups, self.step_size, self.bias_correction2_sqrt
        ):
            states = [self.optimizer._state_for(n, p) for n, p in zip(group.names, group.params)]
            self.optimizer._update_group(group, states, self.lr, step_size, correction)
            for st in states:
                st.count += 1


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
            self.state[name] = AdamWState(self._zeros(p), self._zeros(p), 0)
        return self.state[name]

    def _count(self, name: str) -> int:
        st = self.state.get(name)
        return 0 if st is None else st.count

    def step(self, grads: dict[str, torch.Tensor], lr: float | None = None) -> None:
        """One update of every tensor that has a gradient, in the order of `params`."""
        self.prepare(grads, lr).apply()

    def prepare(self, grads: dict[str, torch.Tensor], lr: float | None = None) -> PreparedStep:
        """The host-side part of `step(grads, lr)`, which the trainer does while the device still
        computes the gradients; the scalars are torch's, from the counts the step would reach
        (`torch/optim/adam.py::_multi_tensor_adam`: `(lr / (1 - beta1**n)) * -1` and
        `(1 - beta2**n) ** 0.5` in Python floats)."""
        lr = self.lr if lr is None else lr
        beta1, beta2 = self.betas
        by_kind: dict[tuple[torch.device, torch.dtype], StepGroup] = {}
        for name, p in self.params.items():
            grad = grads.get(name)
            if grad is None:
                continue
            group = by_kind.setdefault((p.device, p.dtype), StepGroup([], [], []))
            group.names.append(name)
            group.params.append(p)
            group.grads.append(grad)
        groups = list(by_kind.values())
        counts = [[self._count(n) + 1 for n in g.names] for g in groups]
        return PreparedStep(
            self,
            groups,
            lr,
            [[(lr / (1 - beta1**n)) * -1 for n in c] for c in counts],
            [[(1 - beta2**n) ** 0.5 for n in c] for c in counts],
        )

    @torch.no_grad()
    def _update_group(
        self,
        group: StepGroup,
        states: list[AdamWState],
        lr: float,
        step_size: list[float],
        bias_correction2_sqrt: list[float],
    ) -> None:
        # torch/optim/adam.py::_multi_tensor_adam, decoupled_weight_decay=True, capturable=False
        params, grads = group.params, group.grads
        exp_avgs = [st.exp_avg for st in states]
        exp_avg_sqs = [st.exp_avg_sq for st in states]
        beta1, beta2 = self.betas
        torch._foreach_mul_(params, 1 - lr * self.weight_decay)
        torch._foreach_lerp_(exp_avgs, grads, 1 - beta1)
        torch._foreach_mul_(exp_avg_sqs, beta2)
        torch._foreach_addcmul_(exp_avg_sqs, grads, grads, 1 - beta2)
        denom = torch._foreach_sqrt(exp_avg_sqs)
        torch._foreach_div_(denom, bias_correction2_sqrt)
        torch._foreach_add_(denom, self.eps)
        torch._foreach_addcdiv_(params, exp_avgs, denom, step_size)

    def state_tensors(self) -> dict[str, torch.Tensor]:
        """Moments (the live tensors, not copies) and steps, keyed for `TrainState`."""
        out: dict[str, torch.Tensor] = {}
        for name, st in self.state.items():
            out[f"optim/exp_avg/{name}"] = st.exp_avg
            out[f"optim/exp_avg_sq/{name}"] = st.exp_avg_sq
            out[f"optim/step/{name}"] = st.step
        return out

    def load_state_tensors(self, tensors: dict[str, torch.Tensor]) -> None:
        """Inverse of `state_tensors`: moments copied into fresh storage of this optimizer."""
        for name, p in self.params.items():
            key = f"optim/step/{name}"
            if key not in tensors:
                continue
            st = AdamWState(self._zeros(p), self._zeros(p), int(tensors[key].item()))
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
        return sum(st.exp_avg.nbytes * 2 for st in self.state.values())

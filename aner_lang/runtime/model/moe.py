"""Mixture-of-experts MLP: a frozen router picks the top k of E SwiGLU experts for each token.

Routing is transformers' (Mixtral and Qwen3-MoE alike): softmax over the router logits in fp32,
the k largest probabilities, renormalised to sum to 1 when `normalize` (always for Mixtral,
Qwen3-MoE's ``norm_topk_prob``). Mixtral's paper takes the top k of the logits and a softmax over
those k, which is the same numbers.

Each expert is a `LlamaMLP` of three `FrozenLinear` modules, so every storage serves it (one
`NF4Linear` per expert under NF4) and adapters wrap each expert's projections as they wrap any
projection: a ``gate_proj`` LoRA holds one A/B pair per expert. Tokens are grouped by expert (a
stable sort of the token-expert pairs by expert id), the experts' outputs are weighted and added
back with one `index_add_`.

How the experts run: where every expert projection is a frozen base with at most LoRA-style
adapters on it (each adapter says so with ``groups_experts``), each projection is one grouped GEMM
over all the experts' rows (`experts.grouped_frozen` for the base, the adapter's
``grouped_delta`` for its low-rank part): a few kernels per layer whatever the expert count, and
no host read of the group sizes. On CUDA each expert's rows are padded with zero rows to 16 bytes'
worth (`experts.padded_groups`): the kernels' weight gradients read each group from a 16-byte
boundary. Otherwise (DoRA, TinyLoRA or `full` on the experts) each expert with tokens runs its own
modules on its contiguous group, which reads the group sizes on the host. Both give the same
products; the grouped one sums a LoRA's part after rounding the base's.

The load-balancing loss (`load_balancing_loss`) is transformers' `load_balancing_loss_func`
without an attention mask: E * sum_e f_e * P_e over the layers' tokens together, f_e the fraction
of top-k assignments to expert e, P_e its mean router probability. The router logits of a forward
are collected only inside `collecting_router_logits()`.
"""

from __future__ import annotations

import contextvars
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, cast

import torch
from torch import nn

from aner_lang.runtime.model.activations import recomputing
from aner_lang.runtime.model.experts import (
    base_dtype,
    groupable,
    grouped_frozen,
    kernel_runs,
    padded_groups,
    row_alignment,
)
from aner_lang.runtime.model.linear import FrozenLinear
from aner_lang.runtime.model.precision import compute_dtype
from aner_lang.runtime.model.sections import section

PROJECTIONS = ("gate_proj", "up_proj", "down_proj")
"""An expert MLP's projections, in the order they run."""

_ROUTER_LOGITS: contextvars.ContextVar[list[torch.Tensor] | None] = contextvars.ContextVar(
    "router_logits", default=None
)


@contextmanager
def collecting_router_logits() -> Iterator[list[torch.Tensor]]:
    """A list that every `MoeMLP` run inside appends its `[tokens, E]` router logits to."""
    logits: list[torch.Tensor] = []
    token = _ROUTER_LOGITS.set(logits)
    try:
        yield logits
    finally:
        _ROUTER_LOGITS.reset(token)


class MoeMLP(nn.Module):
    """`gate` (the router, `[E, hidden]`) and `experts` (E SwiGLU MLPs), top-`top_k` routing."""

    def __init__(
        self, gate: FrozenLinear, experts: list[nn.Module], top_k: int, normalize: bool
    ) -> None:
        super().__init__()
        self.gate = gate
        self.experts = nn.ModuleList(experts)
        self.top_k, self.normalize = top_k, normalize

    def route(self, flat: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(weights `[N, k]` fp32, expert ids `[N, k]`) of tokens `[N, hidden]`."""
        logits = self.gate(flat)
        collected = _ROUTER_LOGITS.get()
        if collected is not None:
            collected.append(logits)
        probs = torch.softmax(logits.float(), dim=-1)
        weights, chosen = torch.topk(probs, self.top_k, dim=-1)
        if self.normalize:
            weights = weights / weights.sum(dim=-1, keepdim=True)
        return weights, chosen

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        flat = x.reshape(-1, x.shape[-1])
        weights, chosen = self.route(flat)
        ids = chosen.reshape(-1)
        order = ids.argsort(stable=True)  # token-expert pairs grouped by expert
        tokens = order // self.top_k
        # scatter_add_, not bincount: bincount reads the largest id on the host to size its output
        counts = ids.new_zeros(len(self.experts)).scatter_add_(0, ids, torch.ones_like(ids))
        routed = flat.index_select(0, tokens)
        adapters = self._grouped_adapters()
        if adapters is None:
            y = self._looped(routed, counts)
        else:
            align = row_alignment(routed, compute_dtype(routed))
            rows, offs, place = padded_groups(routed, counts, align)
            y = self._grouped(rows, offs, adapters)
            y = y if align == 1 else y.index_select(0, place)
        y = y * weights.reshape(-1)[order, None].to(flat.dtype)
        return torch.zeros_like(flat).index_add_(0, tokens, y).view(x.shape)

    def _projections(self, name: str) -> list[FrozenLinear]:
        return [getattr(e, name) for e in self.experts]

    def _grouped_adapters(self) -> dict[str, list[tuple[Any, list[int]]]] | None:
        """Per projection, the adapters on its experts (each with its target index per expert),
        in the order their hooks run; None where the experts cannot run grouped (see above)."""
        out: dict[str, list[tuple[Any, list[int]]]] = {}
        for name in PROJECTIONS:
            modules = self._projections(name)
            if not groupable(modules) or any(m._forward_pre_hooks for m in modules):
                return None
            hooks = [list(m._forward_hooks.values()) for m in modules]
            if len({len(h) for h in hooks}) != 1:
                return None
            out[name] = []
            for column in zip(*hooks):
                adapter = getattr(column[0], "adapter", None)
                if not getattr(adapter, "groups_experts", False) or any(
                    getattr(h, "adapter", None) is not adapter for h in column
                ):
                    return None
                out[name].append((adapter, [h.index for h in column]))
        return out

    def reads_host(self, dtype: torch.dtype) -> bool:
        """Whether a forward computing in ``dtype`` (with the adapters now attached) reads group
        sizes on the host, which a CUDA graph cannot record: the looped path, or a grouped GEMM
        that `experts.grouped_mm` must run as a loop there."""
        if self._grouped_adapters() is None:
            return True
        for name in PROJECTIONS:
            modules = self._projections(name)
            device = next(iter([*modules[0].buffers(), *modules[0].parameters()])).device
            own = base_dtype(modules, torch.empty(0, dtype=dtype))
            shape = (modules[0].in_features, modules[0].out_features)
            if not all(kernel_runs(d, device, *shape) for d in {own, dtype}):
                return True
        return False

    def _grouped(
        self,
        routed: torch.Tensor,
        offs: torch.Tensor,
        adapters: dict[str, list[tuple[Any, list[int]]]],
    ) -> torch.Tensor:
        """Every expert's MLP on its rows of ``routed``, a grouped GEMM per projection."""

        def project(name: str, x: torch.Tensor) -> torch.Tensor:
            y = grouped_frozen(x, offs, self._projections(name))
            for adapter, indices in adapters[name]:
                with section("lora"):
                    y = y + adapter.grouped_delta(indices, x, offs)
            return y

        activation = self.activation
        gate, up = project("gate_proj", routed), project("up_proj", routed)
        with section("norms_activations"):
            h = activation(gate, up)
        with recomputing(h, lambda: activation(gate, up)):
            return project("down_proj", h)

    @property
    def activation(self) -> Callable[[torch.Tensor, torch.Tensor], torch.Tensor]:
        """The experts' gated activation (their MLP class's ``activation``)."""
        return cast(Any, self.experts[0]).activation

    def _looped(self, routed: torch.Tensor, counts: torch.Tensor) -> torch.Tensor:
        """Every expert's own modules on its rows of ``routed`` (group sizes read on the host)."""
        parts = []
        start = 0
        for expert, n in zip(self.experts, counts.tolist()):
            if n:
                parts.append(expert(routed[start : start + n]))
                start += n
        return torch.cat(parts) if parts else torch.zeros_like(routed)


def load_balancing_loss(logits: list[torch.Tensor], num_experts: int, top_k: int) -> torch.Tensor:
    """transformers' `load_balancing_loss_func` (no attention mask) over every sparse layer's
    router logits of one forward: a scalar, num_experts at perfect imbalance, top_k at balance."""
    probs = torch.softmax(torch.cat(logits).float(), dim=-1)
    chosen = torch.topk(probs, top_k, dim=-1).indices
    assigned = torch.zeros(num_experts, device=probs.device).scatter_add_(
        0, chosen.reshape(-1), torch.ones(chosen.numel(), device=probs.device)
    )
    rows = probs.shape[0]
    return (assigned / rows * (probs.sum(dim=0) / rows)).sum() * num_experts

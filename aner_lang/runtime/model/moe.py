"""Mixture-of-experts MLP: a frozen router picks the top k of E SwiGLU experts for each token.

Routing is transformers' (Mixtral and Qwen3-MoE alike): softmax over the router logits in fp32,
the k largest probabilities, renormalised to sum to 1 when `normalize` (always for Mixtral,
Qwen3-MoE's ``norm_topk_prob``). Mixtral's paper takes the top k of the logits and a softmax over
those k, which is the same numbers.

Each expert is a `LlamaMLP` of three `FrozenLinear` modules, so every storage serves it (one
`NF4Linear` per expert under NF4, through the same matmul as a dense layer's) and adapters wrap
each expert's projections as they wrap any projection: a ``gate_proj`` LoRA holds one A/B pair per
expert. Tokens are grouped by expert (a stable sort of the token-expert pairs by expert id), and
each expert with tokens runs once on its contiguous group, its outputs weighted and added back
with `index_add_`. A loop over the experts rather than one `torch.bmm`: the groups are ragged,
and a batched GEMM would pad every group to the largest (up to k*T rows for each of E experts);
grouped-GEMM kernels (`torch._grouped_mm`, CUDA only) can replace the loop later.

The load-balancing loss (`load_balancing_loss`) is transformers' `load_balancing_loss_func`
without an attention mask: E * sum_e f_e * P_e over the layers' tokens together, f_e the fraction
of top-k assignments to expert e, P_e its mean router probability. The router logits of a forward
are collected only inside `collecting_router_logits()`.
"""

from __future__ import annotations

import contextvars
from collections.abc import Iterator
from contextlib import contextmanager

import torch
from torch import nn

from aner_lang.runtime.model.linear import FrozenLinear

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
        order = chosen.reshape(-1).argsort(stable=True)  # token-expert pairs grouped by expert
        tokens = order // self.top_k
        counts = torch.bincount(chosen.reshape(-1), minlength=len(self.experts)).tolist()
        pair_weights = weights.reshape(-1)[order]
        routed = flat.index_select(0, tokens)
        out = torch.zeros_like(flat)
        start = 0
        for expert, n in zip(self.experts, counts):
            if n:
                rows = slice(start, start + n)
                y = expert(routed[rows]) * pair_weights[rows, None].to(flat.dtype)
                out.index_add_(0, tokens[rows], y)
                start += n
        return out.view(x.shape)


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

"""How one update is spread over the ranks: `Parallel` (one process) and `DataParallel`.

The trainer asks its `Parallel` for the few operations that differ between one process and
many; everything else (windows, loss scaling, clipping, AdamW, checkpoints) is the same code.

Rules:

* The data order is the one seeded cursor on every rank. A micro-step draws up to `micro_batch`
  examples per rank (`micro_batch * size` in all, fewer at the end of an epoch: windows never
  cross one), rank r taking the r-th of `size` consecutive, near-equal shares, so N ranks with
  `micro_batch: k` train on exactly the windows one process draws with `micro_batch: k * N`, and
  the loss is normalised by the scored tokens of the whole window (every rank counts them from
  the examples, without communication).
* Data parallel (`DataParallel`): every rank holds the whole adapter, runs its share of every
  micro-step and accumulates gradients locally (no communication on micro-steps); once per
  window the gradients are summed over ranks in buckets (`buckets.all_reduce_sum`), after which
  every rank takes the same optimizer step, so the replicas never diverge.
* The window's loss and overflow flag are summed over ranks (`total`), so every rank decides the
  same step, skip or retry; a stop request (a signal to some of the ranks) stops every rank after
  the same update (`any_rank`).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import torch

from aner_lang.runtime.io.world import World
from aner_lang.runtime.tasks.data import Example
from aner_lang.runtime.train.distributed.buckets import all_reduce_sum


class Parallel:
    """One process: each operation is the trainer's own."""

    graphs_off: str | None = None
    """Why CUDA graphs cannot record a step under this kind of parallelism (None: they can)."""
    collective_forward = False
    """Whether a forward pass communicates, so every rank must run every micro-step even when
    its share has nothing to score."""

    def __init__(self, adapter: Any, profile: Any, world: World) -> None:
        self.adapter, self.profile, self.world = adapter, profile, world

    @property
    def trained(self) -> Any:
        """What the training loop runs and steps (the adapter itself unless sharded)."""
        return self.adapter

    def share(self, examples: list[Example]) -> list[Example]:
        """This rank's consecutive share of one micro-step's examples (the r-th of `size`
        near-equal parts; empty when there are fewer examples than ranks)."""
        n, size, rank = len(examples), self.world.size, self.world.rank
        return examples[rank * n // size : (rank + 1) * n // size]

    def gradients(self, params: list[tuple[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
        """The window's gradients, by name, as the optimizer steps them."""
        return {n: p.grad for n, p in params if p.grad is not None}

    def total(self, t: torch.Tensor) -> torch.Tensor:
        """`t` summed over ranks."""
        return t

    def any_rank(self, flag: bool) -> bool:
        """Whether `flag` holds on any rank."""
        return flag

    def grad_norm(self, grads: dict[str, torch.Tensor]) -> torch.Tensor:
        """The total 2-norm of the window's gradients."""
        values = list(grads.values())
        return torch.nn.utils.get_total_norm(values, foreach=_on_cuda(values))

    def clip_grad_norm(
        self, params: list[torch.Tensor], grads: dict[str, torch.Tensor], max_norm: float
    ) -> torch.Tensor:
        """Scale the gradients to a total 2-norm of at most `max_norm`; return the norm."""
        return torch.nn.utils.clip_grad_norm_(params, max_norm, foreach=_on_cuda(params))

    def optimizer_params(self, params: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """The tensors the optimizer updates in place (this rank's part of each master)."""
        return params

    def gathered(self, tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """Optimizer state tensors made whole (what a checkpoint holds) from this rank's parts."""
        return tensors

    def scattered(self, tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """This rank's part of whole optimizer state tensors (inverse of `gathered`)."""
        return tensors

    def finish(self) -> None:
        """After the run: the adapter holds its whole trained tensors again."""


class DataParallel(Parallel):
    """The adapter replicated on every rank, gradients summed once per window."""

    def gradients(self, params: list[tuple[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
        """Summed over ranks; a tensor this rank's share left without a gradient (nothing
        scored) counts as zeros, so every rank reduces the same tensors."""
        for _, p in params:
            if p.grad is None:
                p.grad = torch.zeros_like(p)
        grads = {n: p.grad for n, p in params if p.grad is not None}
        all_reduce_sum(grads.values())
        return grads

    def total(self, t: torch.Tensor) -> torch.Tensor:
        out = t.clone()
        all_reduce_sum([out])
        return out

    def any_rank(self, flag: bool) -> bool:
        return bool(self.total(torch.tensor(float(flag), device=self.adapter.device)))


class CollectiveDataParallel(DataParallel):
    """Data parallel where the forward itself communicates (a sharded base or sharded masters):
    every rank runs every micro-step, for its collectives."""

    collective_forward = True

    def share(self, examples: list[Example]) -> list[Example]:
        """This rank's share, or where it has none (the last micro-step of an epoch with fewer
        examples than ranks) one of the others' examples with nothing scored: the placeholder
        runs the collectives and adds nothing to the loss."""
        mine = super().share(examples)
        if mine or not examples:
            return mine
        first = examples[0]
        return [replace(first, scored=(False,) * len(first.ids))]


def _on_cuda(tensors: list[torch.Tensor]) -> bool:
    """Whether norms and clipping take torch's multi-tensor kernels: on CUDA, as torch's own
    default does there (what transformers' Trainer runs), since a LoRA on every projection has
    hundreds of small tensors and one kernel per tensor costs device time per tensor; on the CPU
    the per-tensor loop, the reference arithmetic the CPU tests compare bit for bit."""
    return bool(tensors) and tensors[0].is_cuda

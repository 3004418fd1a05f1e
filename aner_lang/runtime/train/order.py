"""The order examples are drawn in: a seeded permutation per epoch (or the dataset's own order),
and a resumable cursor whose windows never cross an epoch's end."""

from __future__ import annotations

import math

import torch

from aner_lang.problems.errors import AnerRuntimeError


def epoch_order(n: int, seed: int, epoch: int) -> list[int]:
    gen = torch.Generator().manual_seed(seed * 1_000_003 + epoch)
    return torch.randperm(n, generator=gen).tolist()


def updates_per_epoch(n: int, micro_batch: int, accumulation: int) -> int:
    """Windows of an epoch of `n` examples: the last micro-batch and window may be smaller."""
    return math.ceil(math.ceil(n / micro_batch) / accumulation)


class Cursor:
    """Position in the per-epoch example order (`shuffle`: a seeded permutation per epoch)."""

    def __init__(
        self, n: int, seed: int, epoch: int = 0, position: int = 0, shuffle: bool = True
    ) -> None:
        if not 0 <= position <= n:  # a resumed position comes from a checkpoint's state
            raise AnerRuntimeError(
                f"the training state's data position {position} is outside the {n} examples",
                code="E-STATE-FORMAT",
                notes=("was the checkpoint written for another dataset?",),
            )
        self.n, self.seed, self.shuffle = n, seed, shuffle
        self.epoch, self.position = epoch, position
        self._order = self._order_of(epoch)

    def _order_of(self, epoch: int) -> list[int]:
        return epoch_order(self.n, self.seed, epoch) if self.shuffle else list(range(self.n))

    def window(self, micro_batch: int, accumulation: int) -> list[list[int]]:
        """The next accumulation window: up to `accumulation` micro-batches of up to
        `micro_batch` example indices, all from one epoch (a new one begins when the last ended)."""
        if self.position == self.n:
            self.epoch, self.position = self.epoch + 1, 0
            self._order = self._order_of(self.epoch)
        batches: list[list[int]] = []
        while len(batches) < accumulation and self.position < self.n:
            batches.append(self._order[self.position : self.position + micro_batch])
            self.position += len(batches[-1])
        return batches

    @property
    def epochs(self) -> float:
        """Epochs done: whole ones plus the part of the current one."""
        return self.epoch + self.position / self.n

    def mark(self) -> tuple[int, int]:
        return self.epoch, self.position

    def restore(self, mark: tuple[int, int]) -> None:
        if mark[0] != self.epoch:
            self._order = self._order_of(mark[0])
        self.epoch, self.position = mark

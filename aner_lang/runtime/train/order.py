"""The order examples are drawn in: a seeded permutation per epoch, and a resumable cursor."""

from __future__ import annotations

import torch

from aner_lang.errors import AnerRuntimeError


def epoch_order(n: int, seed: int, epoch: int) -> list[int]:
    gen = torch.Generator().manual_seed(seed * 1_000_003 + epoch)
    return torch.randperm(n, generator=gen).tolist()


class Cursor:
    """Position in the seeded per-epoch example order."""

    def __init__(self, n: int, seed: int, epoch: int = 0, position: int = 0) -> None:
        if not 0 <= position <= n:  # a resumed position comes from a checkpoint's state
            raise AnerRuntimeError(
                f"the training state's data position {position} is outside the {n} examples",
                code="E-STATE-FORMAT",
                notes=("was the checkpoint written for another dataset?",),
            )
        self.n, self.seed, self.epoch, self.position = n, seed, epoch, position
        self._order = epoch_order(n, seed, epoch)

    def take(self, k: int) -> list[int]:
        out = []
        for _ in range(k):
            if self.position == self.n:
                self.epoch, self.position = self.epoch + 1, 0
                self._order = epoch_order(self.n, self.seed, self.epoch)
            out.append(self._order[self.position])
            self.position += 1
        return out

    def mark(self) -> tuple[int, int]:
        return self.epoch, self.position

    def restore(self, mark: tuple[int, int]) -> None:
        if mark[0] != self.epoch:
            self._order = epoch_order(self.n, self.seed, mark[0])
        self.epoch, self.position = mark

"""Batches and the loss shared by evaluation and training (the datasets are `records`').

An `Example` (from `Dataset.examples`) is at most `context` token ids; `scored[t]` says whether
token t is a target the loss predicts (from position t-1). `collate` right-pads examples into a
`Batch` whose unscored targets are IGNORE, and the loss is mean next-token cross-entropy over
scored targets; `token_loss_sum` returns the sum so a caller can normalise over a whole
accumulation window.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from aner_lang.runtime.tasks.records import Example

IGNORE = -100


@dataclass(frozen=True)
class Batch:
    """Right-padded `input_ids [B, T]` and next-token `targets [B, T]` (IGNORE where unscored)."""

    input_ids: torch.Tensor
    targets: torch.Tensor

    @property
    def scored_tokens(self) -> int:
        return int((self.targets != IGNORE).sum())


def collate(examples: Sequence[Example], pad_id: int, device: torch.device | str = "cpu") -> Batch:
    """Pad examples on the right into one batch; causal attention keeps pads out of the loss."""
    width = max(len(e.ids) for e in examples)
    ids = torch.full((len(examples), width), pad_id, dtype=torch.long)
    targets = torch.full((len(examples), width), IGNORE, dtype=torch.long)
    for row, e in enumerate(examples):
        n = len(e.ids)
        ids[row, :n] = torch.tensor(e.ids, dtype=torch.long)
        tgt = torch.tensor(e.ids[1:], dtype=torch.long)
        keep = torch.tensor(e.scored[1:], dtype=torch.bool)
        targets[row, : n - 1] = torch.where(keep, tgt, torch.full_like(tgt, IGNORE))
    return Batch(ids.to(device), targets.to(device))


def token_loss_sum(logits: torch.Tensor, batch: Batch) -> torch.Tensor:
    """Sum of next-token cross-entropy over the batch's scored targets (fp32 scalar)."""
    return F.cross_entropy(
        logits.float().reshape(-1, logits.shape[-1]),
        batch.targets.reshape(-1),
        ignore_index=IGNORE,
        reduction="sum",
    )

"""Examples as tensors: the right-padded batch a forward pass and its loss read.

Kept apart from `data` (datasets as text and token ids) so that datasets need no torch: a script
that only talks to model services builds and tokenizes them without the native packages.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from aner_lang.runtime.model.loss import IGNORE
from aner_lang.runtime.tasks.data import Example


@dataclass(frozen=True)
class Batch:
    """Right-padded `input_ids [B, T]`, next-token `targets [B, T]` (IGNORE where unscored) and,
    for packed rows, `positions [B, T]` (restarting at 0 at each example; padding counts as
    examples of one token)."""

    input_ids: torch.Tensor
    targets: torch.Tensor
    positions: torch.Tensor | None = None

    @property
    def scored_tokens(self) -> int:
        return int((self.targets != IGNORE).sum())


def collate(examples: Sequence[Example], pad_id: int, device: torch.device | str = "cpu") -> Batch:
    """Pad examples on the right into one batch on `device`; causal attention keeps pads out of
    the loss."""
    width = max(len(e.ids) for e in examples)
    ids = torch.full((len(examples), width), pad_id, dtype=torch.long)
    targets = torch.full((len(examples), width), IGNORE, dtype=torch.long)
    packed = any(e.segments is not None for e in examples)
    positions = torch.zeros((len(examples), width), dtype=torch.long) if packed else None
    for row, e in enumerate(examples):
        n = len(e.ids)
        ids[row, :n] = torch.tensor(e.ids, dtype=torch.long)
        tgt = torch.tensor(e.ids[1:], dtype=torch.long)
        keep = torch.tensor(e.scored[1:], dtype=torch.bool)
        targets[row, : n - 1] = torch.where(keep, tgt, torch.full_like(tgt, IGNORE))
        if positions is not None:
            positions[row, :n] = torch.cat([torch.arange(k) for k in e.segments or (n,)])
    return Batch(
        _to(ids, device),
        _to(targets, device),
        None if positions is None else _to(positions, device),
    )


def _to(t: torch.Tensor, device: torch.device | str) -> torch.Tensor:
    """`t` on `device`. To CUDA through pinned memory, asynchronously: a copy from pageable
    memory makes the host wait until the device has finished all the work queued before it,
    and the trainer issues its next step while the last one's optimizer runs. The pinned block
    goes back to torch's pool once the copy is done (its host allocator tracks that)."""
    if torch.device(device).type != "cuda":
        return t.to(device)
    return t.pin_memory().to(device, non_blocking=True)


def length_groups(examples: Sequence[Example], rows: int, tokens: int) -> list[list[Example]]:
    """`examples` by ascending length, in groups of at least `rows` rows (the last may have
    fewer) and beyond that as many as keep rows times the longest row within `tokens`: one
    forward each, with little padding. Rows of one length are ordered by their tokens, so the
    groups depend on the rows only, not on the order they come in."""
    ordered = sorted(examples, key=lambda e: (len(e.ids), e.ids))  # the rows', not their order
    out: list[list[Example]] = []
    for example in ordered:
        group = out[-1] if out else None
        if group is not None and (
            len(group) < rows or (len(group) + 1) * len(example.ids) <= tokens
        ):
            group.append(example)
        else:
            out.append([example])
    return out

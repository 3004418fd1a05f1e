"""`TrainState`: everything needed to continue training bit-identically (docs/internals.md,
"Trainer state contract"). Checkpoints write it; the trainer snapshots it after every update."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from typing import Any

import torch

from aner_lang.errors import AnerRuntimeError

STATE_FORMAT = "aner.train-state/1"


@dataclass
class Counters:
    """What a run has done so far (`state.json`'s ``counters``)."""

    updates: int = 0
    """Accumulation windows done, applied or skipped: `train(..., steps: n)` runs until n."""
    applied: int = 0
    """Updates the optimizer applied (the schedule's position)."""
    skipped_updates: int = 0
    retries: int = 0
    scored_tokens: int = 0
    loss_history: list[float] = field(default_factory=list)
    validation_history: list[list[float]] = field(default_factory=list)
    """``[update, validation loss]`` pairs."""
    validation_accuracy: list[list[float]] = field(default_factory=list)
    """``[update, held-out preference accuracy]`` pairs (DPO and ORPO)."""
    stopped_early: bool = False
    """Early stopping ended the training (`patience`): continuing it trains no further."""

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Counters:
        return cls(**json.loads(json.dumps(data)))


@dataclass
class TrainState:
    """Everything needed to continue training bit-identically (docs/internals.md)."""

    tensors: dict[str, torch.Tensor]
    meta: dict[str, Any]

    @property
    def updates(self) -> int:
        return int(self.meta["counters"]["updates"])

    def to_tensors(self) -> dict[str, torch.Tensor]:
        return {k: v.detach().cpu().contiguous() for k, v in self.tensors.items()}

    def to_json(self) -> dict[str, Any]:
        return dict(json.loads(json.dumps(self.meta)))

    @classmethod
    def from_parts(cls, tensors: dict[str, torch.Tensor], meta: dict[str, Any]) -> TrainState:
        if meta.get("format") != STATE_FORMAT:
            raise AnerRuntimeError(
                f"not an Aner training state (format {meta.get('format')!r}, "
                f"expected {STATE_FORMAT})",
                code="E-STATE-FORMAT",
            )
        return cls(dict(tensors), json.loads(json.dumps(meta)))

"""`TrainState`: everything needed to continue training bit-identically (docs/internals.md,
"Trainer state contract"). Checkpoints write it; the trainer snapshots it after every update."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import torch

from aner_lang.errors import AnerRuntimeError

STATE_FORMAT = "aner.train-state/1"


@dataclass
class TrainState:
    """Everything needed to continue training bit-identically (docs/internals.md)."""

    tensors: dict[str, torch.Tensor]
    meta: dict[str, Any]

    @property
    def updates(self) -> int:
        return self.meta["counters"]["updates"]

    def to_tensors(self) -> dict[str, torch.Tensor]:
        return {k: v.detach().cpu().contiguous() for k, v in self.tensors.items()}

    def to_json(self) -> dict:
        return json.loads(json.dumps(self.meta))

    @classmethod
    def from_parts(cls, tensors: dict[str, torch.Tensor], meta: dict) -> TrainState:
        if meta.get("format") != STATE_FORMAT:
            raise AnerRuntimeError(
                f"not an Aner training state (format {meta.get('format')!r}, "
                f"expected {STATE_FORMAT})",
                code="E-STATE-FORMAT",
            )
        return cls(dict(tensors), json.loads(json.dumps(meta)))

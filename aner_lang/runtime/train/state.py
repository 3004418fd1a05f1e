"""`TrainState`: everything needed to continue training bit-identically (docs/internals.md,
"Trainer state contract"). Checkpoints write it; the trainer snapshots it after every update."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field, fields
from typing import Any

import torch

from aner_lang.problems.errors import AnerRuntimeError
from aner_lang.runtime.io.host_copy import PendingCopies

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


class TrainState:
    """Everything needed to continue training bit-identically (docs/internals.md). Its tensors
    may still be being copied to the host (a snapshot's, `host_copy.PendingCopies`): reading them
    waits for that."""

    def __init__(
        self, tensors: dict[str, torch.Tensor] | PendingCopies, meta: dict[str, Any]
    ) -> None:
        self._tensors = tensors
        self.meta = meta

    @property
    def tensors(self) -> dict[str, torch.Tensor]:
        if isinstance(self._tensors, PendingCopies):
            self._tensors = self._tensors.result()
        return self._tensors

    @property
    def nbytes(self) -> int:
        """The tensors' bytes, without waiting for them to be copied."""
        if isinstance(self._tensors, PendingCopies):
            return self._tensors.nbytes
        return sum(t.nbytes for t in self._tensors.values())

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
        _check_schema(meta)
        return cls(dict(tensors), json.loads(json.dumps(meta)))


_JSON_KINDS: dict[str, tuple[type, ...]] = {
    "bool": (bool,),
    "int": (int,),
    "float": (int, float),
    "str": (str,),
    "dict": (dict,),
    "list[float]": (list,),
    "list[list[float]]": (list,),
}
_SECTIONS = {
    "adapter": "dict",
    "profile": "dict",
    "base": "dict",
    "kernel_identity": "str",
    "loss_scale": "dict",
    "data": "dict",
    "counters": "dict",
    "options": "dict",
}
_DATA = {"seed": "int", "epoch": "int", "position": "int", "accumulation_offset": "int"}
_BASE = {"path": "str", "storage": "str"}


def _check_schema(meta: dict[str, Any]) -> None:
    """The shape of a training state (what `Trainer.state` writes): every section and field
    present with a value of its type, counts not negative. A state that passes is one the
    trainer can continue from; anything else is `E-STATE-FORMAT`, naming the field."""
    from aner_lang.runtime.train.loss_scale import LossScaleState

    _fields(meta, {"format": "str", **_SECTIONS}, "")
    _fields(meta["base"], _BASE, "base.")
    _fields(meta["data"], _DATA, "data.")
    for name, kind in (("counters", Counters), ("loss_scale", LossScaleState)):
        spec = {f.name: str(f.type) for f in fields(kind)}
        _fields(meta[name], spec, f"{name}.")
        if set(meta[name]) != set(spec):
            raise AnerRuntimeError(
                f"the training state's `{name}` has the fields {sorted(meta[name])}",
                code="E-STATE-FORMAT",
                notes=(f"expected {sorted(spec)}",),
            )
    counts = [meta["data"][k] for k in ("epoch", "position")]
    counts += [v for v in meta["counters"].values() if type(v) is int]
    pairs = meta["counters"]["validation_history"]
    history = meta["counters"]["loss_history"] + [
        x for pair in pairs for x in (pair if isinstance(pair, list) else [pair])
    ]
    if min(counts, default=0) < 0 or not all(type(x) in (int, float) for x in history):
        raise AnerRuntimeError(
            "the training state holds a negative count or a loss that is not a number",
            code="E-STATE-FORMAT",
        )


def _fields(section: dict[str, Any], spec: dict[str, str], where: str) -> None:
    for key, kind in spec.items():
        value = section.get(key)
        kinds = _JSON_KINDS[kind]
        if not isinstance(value, kinds) or (isinstance(value, bool) and bool not in kinds):
            raise AnerRuntimeError(
                f"the training state's `{where}{key}` is {json.dumps(value)[:40]}, not a {kind}",
                code="E-STATE-FORMAT",
                notes=("a state written by Aner always has it; this one was altered",),
            )

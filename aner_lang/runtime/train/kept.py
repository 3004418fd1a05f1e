"""What a finished `train` call keeps on the device for the next call on the same adapter:
continuing then costs that call neither a CUDA graph recording with its eager step (~1 s at 8B)
nor the optimizer state's trip through host memory (~0.3 s at 8B: waiting for the host copies
of the last snapshot, then copying them back).

Rules:

* The process keeps one set at most: the last finished call's. A call on another adapter
  releases it before it allocates, and so do the adapter's collection, a call that fails or is
  stopped, and a script's other GPU work (the interpreter, `ExecContext.held`).
* Graphs are replayed only under the same key (`trainer.graph_key`: the settings they were
  recorded under and where every tensor they read lives; None where none was recorded);
  otherwise they are released.
* `live` is the dict of live tensors the call's final snapshot copied (adapter, optimizer moments,
  generator state). Nothing changes them after that snapshot, so they equal its host copies bit
  for bit, and the next call continues from them when it continues that very state (`state is`
  the adapter's); from the host copies otherwise.
"""

from __future__ import annotations

import weakref
from collections.abc import Hashable
from dataclasses import dataclass, field
from typing import Any

import torch

from aner_lang.runtime.train.graphs import GraphSteps


@dataclass(eq=False)
class Kept:
    """One call's kept graphs and state, for its adapter (`owner`)."""

    owner: weakref.ref[Any]
    key: Hashable
    steps: GraphSteps
    state: Any
    """The `TrainState` the call left, which `live` is the device side of."""
    live: dict[str, torch.Tensor] = field(default_factory=dict)

    def release(self) -> None:
        self.steps.release()
        self.live = {}


_KEPT: list[Kept] = []


def keep(
    owner: Any, key: Hashable, steps: GraphSteps, state: Any, live: dict[str, torch.Tensor]
) -> None:
    """Keep a finished call's graphs and its final state's live tensors for `owner`'s next call
    (releasing whatever was kept before)."""
    release_kept()
    kept = Kept(weakref.ref(owner, lambda _: _drop(kept)), key, steps, state, live)
    _KEPT.append(kept)


def take_kept(owner: Any) -> Kept | None:
    """What was kept for `owner`, now the caller's; what was kept for another is released."""
    kept = _KEPT.pop() if _KEPT else None
    if kept is not None and kept.owner() is owner:
        return kept
    if kept is not None:
        kept.release()
    return None


def release_kept() -> None:
    """Release what is kept, if anything."""
    while _KEPT:
        _KEPT.pop().release()


def _drop(kept: Kept) -> None:
    if kept in _KEPT:  # its owner was collected while it was kept
        _KEPT.remove(kept)
        kept.release()

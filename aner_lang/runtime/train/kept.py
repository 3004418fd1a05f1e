"""What a finished `train` call keeps on the device for the next call: continuing its adapter then
costs that call neither a CUDA graph recording with its eager step (~1 s at 8B) nor the optimizer
state's trip through host memory (~0.3 s at 8B: waiting for the host copies of the last
snapshot, then copying them back), and a fresh adapter of the same form (a sweep's next call)
replays the same graphs instead of recording its own (~0.4 s at 8B, host time: a recording
issues every launch of a step from Python).

Rules:

* The process keeps one set at most: the last finished call's. It is released by a call that
  cannot use it (before that call allocates), a call that fails or is stopped, a script's other
  GPU work (the interpreter, `ExecContext.held`), and `release_kept`.
* Graphs are replayed only under the same key (`trainer.graph_key`: the settings they were
  recorded under and where every tensor they read lives; None where none was recorded).
* A graph reads and writes fixed addresses, so the set holds the tensors at them (`slots`: the
  adapter's trainable and frozen tensors; `grads`: its gradients). A fresh adapter of the same
  form (`fits`: the same kernels, profile and base tensors, and the same adapter settings and
  tensor shapes but for the values its seed drew) moves into them (`move_into`): its values are
  copied to the slots and its tensors then live there, so the graphs' key is its own. An owner
  still alive keeps its values, at the fresh adapter's former storage; a collected owner leaves
  the set behind, its state dropped, until such a call or a release.
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
    """One call's kept graphs and state, for its adapter (`owner`, None once collected)."""

    owner: weakref.ref[Any] | None
    key: Hashable
    steps: GraphSteps
    state: Any
    """The `TrainState` the call left, which `live` is the device side of."""
    form: Hashable = None
    """What an adapter must match to move into `slots` (`trainer.adapter_form`)."""
    live: dict[str, torch.Tensor] = field(default_factory=dict)
    slots: dict[str, torch.Tensor] = field(default_factory=dict)
    grads: dict[str, torch.Tensor] = field(default_factory=dict)

    def release(self) -> None:
        self.steps.release()
        self.live, self.slots, self.grads = {}, {}, {}

    def owned_by(self, adapter: Any) -> bool:
        return self.owner is not None and self.owner() is adapter

    def fits(self, key: Hashable, form: Hashable) -> bool:
        """Whether an adapter of `form`, whose graphs would have `key`, can replay these graphs
        once moved into the slots: the same kernels, profile and base tensors (the key's first
        three parts) and the same form; only a set with recorded graphs."""
        if self.key is None or not self.slots or form != self.form:
            return False
        assert isinstance(self.key, tuple) and isinstance(key, tuple)
        return self.key[:3] == key[:3]

    def move_into(self, adapter: Any) -> None:
        """`adapter`'s tensors moved into the slots with their values, its gradients the
        graphs' (zeroed), the set now its own (the module's rules)."""
        owner = self.owner() if self.owner is not None else None
        theirs = {} if owner is None else {**owner.params, **owner.frozen}
        with torch.no_grad():
            for name, t in {**adapter.params, **adapter.frozen}.items():
                slot = self.slots[name]
                if name in theirs:  # the owner's values go where the adapter's were
                    fresh, values = t.data, t.detach().clone()
                    fresh.copy_(slot)
                    theirs[name].data = fresh
                    slot.copy_(values)
                else:
                    slot.copy_(t)
                t.data = slot
        for name, p in adapter.params.items():
            grad = self.grads[name]
            grad.zero_()
            p.grad = grad
            if owner is not None:
                owner.params[name].grad = None
        self.owner = _owned(self, adapter)
        self.live, self.state = {}, None


_KEPT: list[Kept] = []


def keep(
    owner: Any,
    key: Hashable,
    steps: GraphSteps,
    state: Any,
    live: dict[str, torch.Tensor],
    form: Hashable,
) -> None:
    """Keep a finished call's graphs, the tensors they read (where it recorded any) and its
    final state's live tensors for the next call (releasing whatever was kept before)."""
    release_kept()
    kept = Kept(None, key, steps, state, form, live)
    if key is not None:
        kept.slots = {n: t.detach() for n, t in {**owner.params, **owner.frozen}.items()}
        kept.grads = {n: p.grad for n, p in owner.params.items() if p.grad is not None}
    kept.owner = _owned(kept, owner)
    _KEPT.append(kept)


def take_kept() -> Kept | None:
    """What was kept, now the caller's (who releases what it cannot use)."""
    return _KEPT.pop() if _KEPT else None


def release_kept() -> None:
    """Release what is kept, if anything."""
    while _KEPT:
        _KEPT.pop().release()


def _owned(kept: Kept, owner: Any) -> weakref.ref[Any]:
    """A reference to `owner` that leaves `kept` behind when the owner is collected, while it is
    still the set's owner: the graphs and slots stay for a fresh adapter, the state goes (nothing
    else can continue it); a set without graphs goes too."""

    def orphan(ref: weakref.ref[Any]) -> None:
        if kept.owner is not ref:  # the set has moved to another adapter since
            return
        kept.owner, kept.live, kept.state = None, {}, None
        if kept.key is None:
            _drop(kept)

    return weakref.ref(owner, orphan)


def _drop(kept: Kept) -> None:
    if kept in _KEPT:
        _KEPT.remove(kept)
        kept.release()

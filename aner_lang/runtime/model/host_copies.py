"""`offload`'s copies of the tensors backward needs, in pinned host memory and back.

Rules:

* A copy in either direction runs on one side stream per device, after an event of the stream
  that produced or will consume the tensor, so neither the host nor the compute stream waits
  for it (`torch.autograd.graph.save_on_cpu` copies to the host synchronously, stalling the host
  once per layer). The device tensor is marked as used by the side stream, so the allocator does
  not hand its memory out before the copy has read it.
* A copy keeps the tensor's strides: a matmul saves transposed views, and backward given the
  same values in another layout takes another GEMM, whose sums round otherwise. So backward runs
  the same kernels on what comes back, bit for bit.
* Unpacking a copy starts fetching the copy packed before it, which under checkpointing is the
  next layer backward reaches: its transfer overlaps this layer's backward. What a layer keeps
  besides its input (`HostCopies.keep`) travels with that input's copy. A copy backward has
  unpacked already (its consumers need not run in the reverse order of its producers) is not
  fetched again.
* Each copy is pinned at exactly its bytes, its block handed out again once the copy is freed
  (`pinned_blocks`): every copy in or out of those blocks runs on the one side stream, which
  keeps a block's next copy after its last.
"""

from __future__ import annotations

import weakref
from typing import Any, cast

import torch

from aner_lang.runtime.model import pinned_blocks


def held(t: torch.Tensor) -> torch.Tensor:
    """`t` as a pack hook keeps it: detached, so a node that saves its own output does not hold
    itself through it (a reference cycle in C++ that no collector sees) when its graph is dropped
    without a backward, as after an error mid-step; the values and storage are the same."""
    return t.detach()


class HostCopy:
    """One saved CUDA tensor in pinned host memory: its copy there, and its way back."""

    def __init__(self, host: torch.Tensor, device: torch.device, stored: torch.cuda.Event) -> None:
        self.host, self.device, self.stored = host, device, stored
        self.fetched: tuple[torch.Tensor, torch.cuda.Event] | None = None
        self.used = False
        """Whether backward has unpacked it: then it is not fetched ahead again."""
        self.before: weakref.ref[HostCopy] | None = None
        """The copy packed just before this one: backward is likely to need it next."""
        self.companions: list[HostCopy] = []
        """What a layer kept beside this copy of its input (`HostCopies.keep`): fetched with it."""


class HostCopies:
    """Saved-tensor hooks that keep every saved CUDA tensor in pinned host memory, by the
    module's rules; CPU tensors are kept as they are."""

    def __init__(self) -> None:
        self._streams: dict[torch.device, torch.cuda.Stream] = {}
        self._last: weakref.ref[HostCopy] | None = None

    def _stream(self, device: torch.device) -> torch.cuda.Stream:
        if device not in self._streams:
            self._streams[device] = torch.cuda.Stream(device=device)
        return self._streams[device]

    def pack(self, t: torch.Tensor) -> Any:
        copy = self._copy(t)
        if isinstance(copy, HostCopy):
            copy.before, self._last = self._last, weakref.ref(copy)
        return copy

    def keep(self, t: torch.Tensor) -> Any:
        """`t`'s host copy (a CPU tensor as it is), outside the order backward fetches ahead in:
        what a checkpoint keeps besides its layer's input (`kept_through_backward`). It goes
        with the copy packed last (the layer's input), so backward fetches it one layer ahead
        with that copy, or else when its layer's recomputation starts (`prefetch`)."""
        copy = self._copy(t)
        last = self._last() if self._last is not None else None
        if isinstance(copy, HostCopy) and last is not None:
            last.companions.append(copy)
        return copy

    def _copy(self, t: torch.Tensor) -> Any:
        """`t`'s host copy, moving on the side stream; a CPU tensor as it is."""
        if t.device.type != "cuda":
            return held(t)
        side = self._stream(t.device)
        side.wait_stream(torch.cuda.current_stream(t.device))
        # its strides too: a matmul saves transposed views, and the same values in another
        # layout take another GEMM in backward, whose sums round otherwise
        host = pinned_blocks.empty_like(t)
        with torch.cuda.stream(side):
            host.copy_(t, non_blocking=True)
            stored = torch.cuda.Event()
            stored.record(side)
        t.record_stream(side)
        return HostCopy(host, t.device, stored)

    def prefetch(self, copy: HostCopy) -> None:
        """Start bringing `copy` and its companions back, each unless on its way or used."""
        for c in (copy, *copy.companions):
            if c.fetched is None and not c.used:
                self._fetch(c)

    def _fetch(self, copy: HostCopy) -> tuple[torch.Tensor, torch.cuda.Event]:
        """Start `copy`'s way back to its device; the device tensor and the event of its arrival."""
        side = self._stream(copy.device)
        side.wait_event(copy.stored)
        with torch.cuda.stream(side):
            back = copy.host.to(copy.device, non_blocking=True)
            arrived = torch.cuda.Event()
            arrived.record(side)
        copy.fetched = (back, arrived)
        return copy.fetched

    def unpack(self, packed: Any) -> torch.Tensor:
        if not isinstance(packed, HostCopy):
            return cast(torch.Tensor, packed)
        back, arrived = packed.fetched or self._fetch(packed)
        packed.fetched, packed.used = None, True
        current = torch.cuda.current_stream(packed.device)
        current.wait_event(arrived)
        back.record_stream(current)
        ahead = packed.before() if packed.before is not None else None
        if ahead is not None:
            self.prefetch(ahead)
        return back

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
* Host memory is pinned by registering pages (`register_pinned_pages`), not by `cudaHostAlloc`.
"""

from __future__ import annotations

import functools
import os
import weakref
from typing import Any, cast

import torch


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


PINNING = "pinned_use_cuda_host_register:True,pinned_num_register_threads:8"
"""How `offload` has torch's host allocator pin: `malloc`, the pages touched by 8 threads, then
`cudaHostRegister`. torch's default, `cudaHostAlloc`, took 7.0 s to pin the 19.4 GB of copies of
a 16,384-token Llama-3-8B forward on an H100 and held the GPU back meanwhile (bf16 GEMMs beside
it ran at 15 of their 648 TFLOP/s); pinned this way, 2.3 s with the GEMMs at 577
(benchmarks/results/h100_s27_pinned_alloc.json), and a run's first offloaded update of 14,337
tokens took 3.8-4.0 s instead of 7.8 (h100_s27_copies_pinning.json). The copies' bandwidth is
the same (55 GB/s)."""


@functools.cache
def register_pinned_pages() -> None:
    """From now on, pin host memory the `PINNING` way, unless the process's allocator settings
    choose how already. torch takes a settings string whole and resets what it leaves out, so
    the current settings go first and stay as they were: those set at run time where torch can
    say (`torch._C._accelerator_getAllocatorSettings`, from 2.12), else those of the environment
    (`PYTORCH_ALLOC_CONF`, or the older `PYTORCH_CUDA_ALLOC_CONF`). Once a process, through
    `torch._C._accelerator_setAllocatorSettings`, the way torch's deprecation of
    `torch.cuda._set_allocator_settings` names; a torch without it pins as it did."""
    put = getattr(torch._C, "_accelerator_setAllocatorSettings", None)
    if put is None:
        return
    get = getattr(torch._C, "_accelerator_getAllocatorSettings", None)
    current = (
        get()
        if get is not None
        else os.environ.get("PYTORCH_ALLOC_CONF") or os.environ.get("PYTORCH_CUDA_ALLOC_CONF", "")
    )
    if "pinned_use_cuda_host_register" not in current:
        put(",".join(filter(None, (current, PINNING))))


class HostCopies:
    """Saved-tensor hooks that keep every saved CUDA tensor in pinned host memory, by the
    module's rules; CPU tensors are kept as they are."""

    def __init__(self) -> None:
        register_pinned_pages()
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
        host = torch.empty_like(t, device="cpu", pin_memory=True)
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

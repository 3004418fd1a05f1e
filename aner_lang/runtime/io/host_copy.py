"""Detached CPU copies of many tensors with one wait for all of them.

A training snapshot (at the end of every `train` call and at every checkpoint, so a run can be
continued exactly) copies every adapter tensor and both AdamW moments of each: hundreds of small
tensors for a LoRA, thousands for one on every projection of a large model. Copied one `.cpu()` at
a time, each waits for the GPU, a host-device round trip apiece. Here the small ones are queued
into one pinned staging buffer, one synchronisation per device covers them all, and each is then
copied out of it into its own pageable tensor.

Rules and reasons:

* One pinned staging buffer, not one allocation per tensor: pinning locks pages, a system call
  whose cost grows with the bytes pinned (about 0.5 GB for a LoRA on every projection of an 8B
  model and its AdamW moments), and torch empties its own pinned-memory cache at every CUDA graph recording
  (`torch.cuda.graph`), so a buffer from that cache would be pinned again at the first snapshot
  after each recording.
* The buffer is kept from one snapshot to the next while `keeping_staging` says so (a `train`
  call, which snapshots at every checkpoint and at its end), grown when a call needs more, and
  given back to torch's pinned cache when the last keeper leaves: pinned memory is scarcer than
  pageable memory, so no run holds it for the next. `keeping_staging(bytes)` pins the expected
  size as the run starts, before any graph is recorded, in the calling thread: pinning from
  another thread while a graph records is one of the calls a global-mode capture forbids.
* The copies never share storage with each other or alias the originals: a snapshot's tensors are
  written by safetensors, which refuses tensors that share memory, and outlive the staging
  buffer's next use.
* Large tensors take the plain copy (the transfer dwarfs the wait).
* The result keeps the order of `tensors` (a checkpoint's bytes follow it).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch

PINNED_MAX_BYTES = 1 << 20
"""The largest tensor copied through the staging buffer."""
ALIGN = 64
"""Byte alignment of each tensor's place in the staging buffer (any dtype can view it)."""


class _Staging:
    """The process's pinned staging buffer (see the rules), used by the training thread only."""

    def __init__(self) -> None:
        self.buffer: torch.Tensor | None = None
        self.keepers = 0

    def take(self, nbytes: int) -> torch.Tensor:
        """At least `nbytes` of pinned memory."""
        if self.buffer is None or self.buffer.numel() < nbytes:
            self.buffer = None  # back to torch's cache before the larger one is pinned
            self.buffer = torch.empty(nbytes, dtype=torch.uint8, pin_memory=True)
        return self.buffer[:nbytes]

    def done(self) -> None:
        """After a use: drop the buffer unless a keeper holds it."""
        if not self.keepers:
            self.buffer = None


_STAGING = _Staging()


@contextmanager
def keeping_staging(expected: int) -> Iterator[None]:
    """Keep the pinned staging buffer between snapshots inside the block, pinning `expected`
    bytes (`staging_bytes` of what will be copied) as it begins; with the last keeper, the
    buffer goes back to torch's cache when the block ends."""
    _STAGING.keepers += 1
    try:
        if expected > 0:
            _STAGING.take(expected)
        yield
    finally:
        _STAGING.keepers -= 1
        _STAGING.done()


def staging_bytes(tensors: dict[str, torch.Tensor]) -> int:
    """Bytes of staging buffer `host_copies` needs for `tensors` (their small CUDA ones)."""
    return sum(_aligned(t) for t in tensors.values() if _staged(t))


def _staged(t: torch.Tensor) -> bool:
    return t.is_cuda and t.numel() * t.element_size() <= PINNED_MAX_BYTES


def _aligned(t: torch.Tensor) -> int:
    return -(-(t.numel() * t.element_size()) // ALIGN) * ALIGN


def host_copies(tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Contiguous CPU copies of ``tensors`` (detached; never aliasing the originals or each
    other)."""
    out: dict[str, torch.Tensor] = {}
    staged: dict[str, torch.Tensor] = {}
    for name, t in tensors.items():
        t = t.detach()
        if _staged(t):
            staged[name] = t
        elif t.is_cuda:
            out[name] = t.cpu().contiguous()
        else:
            out[name] = t.clone(memory_format=torch.contiguous_format)
    if staged:
        out.update(staged_copies(staged, pinned=True))
    return {name: out[name] for name in tensors}


def staged_copies(tensors: dict[str, torch.Tensor], pinned: bool) -> dict[str, torch.Tensor]:
    """Pageable CPU copies of `tensors`, transferred together through one staging buffer (the
    pinned one for CUDA tensors: an asynchronous copy needs it), each at an `ALIGN`ed offset."""
    nbytes = max(sum(_aligned(t) for t in tensors.values()), 1)
    if not pinned:
        return _copied_through(torch.empty(nbytes, dtype=torch.uint8), tensors)
    try:
        return _copied_through(_STAGING.take(nbytes), tensors)
    finally:
        _STAGING.done()


def _copied_through(
    staging: torch.Tensor, tensors: dict[str, torch.Tensor]
) -> dict[str, torch.Tensor]:
    views: dict[str, torch.Tensor] = {}
    start = 0
    for name, t in tensors.items():
        size = t.numel() * t.element_size()
        view = staging[start : start + size].view(t.dtype).view(t.shape)
        views[name] = view.copy_(t, non_blocking=True)
        start += _aligned(t)
    for device in {t.device for t in tensors.values() if t.is_cuda}:
        torch.cuda.synchronize(device)
    return {name: torch.empty(v.shape, dtype=v.dtype).copy_(v) for name, v in views.items()}

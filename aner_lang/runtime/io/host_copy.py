"""Detached CPU copies of many tensors with one wait for all of them.

A training snapshot (at the end of every `train` call and at every checkpoint, so a run can be
continued exactly) copies every adapter tensor and both AdamW moments of each: hundreds of small
tensors for a LoRA, thousands for one on every projection of a large model. Copied one `.cpu()` at
a time, each waits for the GPU, a host-device round trip apiece. Here the small ones are queued
into one pinned staging buffer, one synchronisation per device covers them all, and each is then
copied out of it into its own pageable tensor by a thread (`host_copies_soon`), while the
training thread goes on.

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
* The calling thread queues the transfers and waits for the device (tens of milliseconds for
  half a gigabyte): after that the originals may change. The copies out of the staging buffer
  into fresh pageable memory, thousands of allocations whose first touch of every page is a
  fault (seconds where the host is short of free pages, e.g. while the disk flushes a model
  just written), run in a thread that makes no CUDA call, so a graph may record meanwhile.
  The next use of the staging buffer waits for that thread; `PendingCopies.result()` does too.
  The thread is not a daemon: a process ending while it copies waits for it (a daemon thread
  inside torch when the interpreter finalises aborts the process).
* The copies never share storage with each other or alias the originals: a snapshot's tensors
  may be written by safetensors, which refuses tensors that share memory, and outlive the
  staging buffer's next use.
* Large tensors take the plain copy (the transfer dwarfs the wait).
* The result keeps the order of `tensors` (a checkpoint's bytes follow it).
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager

import torch

PINNED_MAX_BYTES = 1 << 20
"""The largest tensor copied through the staging buffer."""
ALIGN = 64
"""Byte alignment of each tensor's place in the staging buffer (any dtype can view it)."""


class _Staging:
    """The process's pinned staging buffer (see the rules), taken by the training thread only."""

    def __init__(self) -> None:
        self.buffer: torch.Tensor | None = None
        self.keepers = 0
        self.reader: threading.Thread | None = None
        """The thread copying out of the buffer, if any: the buffer is not reused before it ends."""

    def take(self, nbytes: int) -> torch.Tensor:
        """At least `nbytes` of pinned memory, once no copy reads it any more."""
        self.settle()
        if self.buffer is None or self.buffer.numel() < nbytes:
            self.buffer = None  # back to torch's cache before the larger one is pinned
            self.buffer = torch.empty(nbytes, dtype=torch.uint8, pin_memory=True)
        return self.buffer[:nbytes]

    def settle(self) -> None:
        """Wait for the copy out of the buffer in flight, if any."""
        if self.reader is not None:
            self.reader.join()
            self.reader = None

    def done(self) -> None:
        """After a use: drop the buffer unless a keeper holds it (a copy still reading it holds
        its own reference)."""
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
    return t.is_cuda and t.nbytes <= PINNED_MAX_BYTES


def _aligned(t: torch.Tensor) -> int:
    return -(-t.nbytes // ALIGN) * ALIGN


def host_copies(tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Contiguous CPU copies of ``tensors`` (detached; never aliasing the originals or each
    other)."""
    return host_copies_soon(tensors).result()


class PendingCopies:
    """Host copies of tensors whose transfers are done and whose copies out of the staging
    buffer are being made by a thread (see the rules): `result()` waits for them."""

    def __init__(
        self,
        order: list[str],
        ready: dict[str, torch.Tensor],
        views: dict[str, torch.Tensor],
        staging: _Staging | None,
    ) -> None:
        self._order, self._out = order, ready
        self.nbytes = sum(t.nbytes for t in [*ready.values(), *views.values()])
        """The copies' bytes (known before they are made)."""
        self._views: dict[str, torch.Tensor] | None = views
        self._failure: BaseException | None = None
        self._thread: threading.Thread | None = None
        if views:
            self._thread = threading.Thread(target=self._copy_out, name="aner-host-copy")
            self._thread.start()
            if staging is not None:
                staging.reader = self._thread

    def _copy_out(self) -> None:
        views, self._views = self._views, None  # the staging buffer is free once this ends
        try:
            assert views is not None
            for name, v in views.items():
                self._out[name] = torch.empty(v.shape, dtype=v.dtype).copy_(v)
        except BaseException as e:  # raised again by `result`, in the thread that asks
            self._failure = e

    def result(self) -> dict[str, torch.Tensor]:
        """The copies, in the order given (waits for the thread)."""
        if self._thread is not None:
            self._thread.join()
        if self._failure is not None:
            raise self._failure
        return {name: self._out[name] for name in self._order}


def host_copies_soon(tensors: dict[str, torch.Tensor]) -> PendingCopies:
    """Copies of ``tensors`` as `host_copies` makes them; on return the originals may change,
    and the copies out of the pinned staging buffer are still being made (see the rules)."""
    ready: dict[str, torch.Tensor] = {}
    staged: dict[str, torch.Tensor] = {}
    for name, t in tensors.items():
        t = t.detach()
        if _staged(t):
            staged[name] = t
        elif t.is_cuda:
            ready[name] = t.cpu().contiguous()
        else:
            ready[name] = t.clone(memory_format=torch.contiguous_format)
    if not staged:
        return PendingCopies(list(tensors), ready, {}, None)
    try:
        views = _staged_into(_STAGING.take(_staged_bytes(staged)), staged)
        return PendingCopies(list(tensors), ready, views, _STAGING)
    finally:
        _STAGING.done()


def _staged_bytes(tensors: dict[str, torch.Tensor]) -> int:
    return max(sum(_aligned(t) for t in tensors.values()), 1)


def _staged_into(
    staging: torch.Tensor, tensors: dict[str, torch.Tensor]
) -> dict[str, torch.Tensor]:
    """Views of `staging` holding `tensors`' values, each at an `ALIGN`ed offset, once every
    device has finished the transfers (asynchronous into pinned memory)."""
    views: dict[str, torch.Tensor] = {}
    start = 0
    for name, t in tensors.items():
        size = t.nbytes
        view = staging[start : start + size].view(t.dtype).view(t.shape)
        views[name] = view.copy_(t, non_blocking=True)
        start += _aligned(t)
    for device in {t.device for t in tensors.values() if t.is_cuda}:
        torch.cuda.synchronize(device)
    return views

"""Detached CPU copies of many tensors with one wait for all of them.

A training snapshot (at the end of every `train` call and at every checkpoint, so a run can be
continued exactly) copies every adapter tensor and both AdamW moments of each: hundreds of small
tensors for a LoRA, thousands for one on every projection of a large model. Copied one `.cpu()` at
a time, each waits for the GPU, a host-device round trip apiece. Here the small ones are queued
into one pinned staging buffer, one synchronisation per device covers them all, and each is then
copied out of it into its own pageable tensor.

Rules and reasons:

* One pinned allocation per call, not one per tensor. Pinning is a system call that locks pages,
  and torch empties its pinned-memory cache at every CUDA graph recording (`torch.cuda.graph`), so
  a per-tensor allocation would pay it again for every tensor of every `train` call's snapshot.
* The copies never share storage with each other or alias the originals: a snapshot's tensors are
  written by safetensors, which refuses tensors that share memory, and outlive the staging buffer,
  which goes back to torch's cache once the call returns (pinned memory is a scarcer resource than
  pageable memory, so no snapshot holds on to it).
* Large tensors take the plain copy (the transfer dwarfs the wait).
* The result keeps the order of `tensors` (a checkpoint's bytes follow it).
"""

from __future__ import annotations

import torch

PINNED_MAX_BYTES = 1 << 20
"""The largest tensor copied through the staging buffer."""
ALIGN = 64
"""Byte alignment of each tensor's place in the staging buffer (any dtype can view it)."""


def host_copies(tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Contiguous CPU copies of ``tensors`` (detached; never aliasing the originals or each
    other)."""
    out: dict[str, torch.Tensor] = {}
    staged: dict[str, torch.Tensor] = {}
    for name, t in tensors.items():
        t = t.detach()
        if t.is_cuda and t.numel() * t.element_size() <= PINNED_MAX_BYTES:
            staged[name] = t
        elif t.is_cuda:
            out[name] = t.cpu().contiguous()
        else:
            out[name] = t.clone(memory_format=torch.contiguous_format)
    if staged:
        out.update(staged_copies(staged, pinned=True))
    return {name: out[name] for name in tensors}


def staged_copies(tensors: dict[str, torch.Tensor], pinned: bool) -> dict[str, torch.Tensor]:
    """Pageable CPU copies of `tensors`, transferred together through one staging buffer (pinned
    for CUDA tensors: an asynchronous copy needs it), each at an `ALIGN`ed offset."""
    places: list[tuple[str, torch.Tensor, int, int]] = []
    offset = 0
    for name, t in tensors.items():
        size = t.numel() * t.element_size()
        places.append((name, t, offset, size))
        offset += -(-size // ALIGN) * ALIGN
    staging = torch.empty(max(offset, 1), dtype=torch.uint8, pin_memory=pinned)
    views: dict[str, torch.Tensor] = {}
    for name, t, start, size in places:
        view = staging[start : start + size].view(t.dtype).view(t.shape)
        views[name] = view.copy_(t, non_blocking=True)
    for device in {t.device for t in tensors.values() if t.is_cuda}:
        torch.cuda.synchronize(device)
    return {name: torch.empty(v.shape, dtype=v.dtype).copy_(v) for name, v in views.items()}

"""Detached CPU copies of many tensors with one wait for all of them.

A training snapshot (after every update, so an interrupted run can resume exactly) copies every
adapter tensor and both AdamW moments of each: a few hundred small tensors for a LoRA. Copied one
`.cpu()` at a time, each waits for the GPU, a host-device round trip apiece; here the small ones
are queued into pinned host memory and one synchronisation covers them all. Large tensors take the
plain copy (the transfer dwarfs the wait, and pinned memory is a scarcer resource).
"""

from __future__ import annotations

import torch

PINNED_MAX_BYTES = 1 << 20


def host_copies(tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Contiguous CPU copies of ``tensors`` (detached; never aliasing the originals)."""
    out: dict[str, torch.Tensor] = {}
    queued = False
    for name, t in tensors.items():
        t = t.detach()
        if t.is_cuda and t.numel() * t.element_size() <= PINNED_MAX_BYTES:
            out[name] = torch.empty(t.shape, dtype=t.dtype, pin_memory=True).copy_(
                t, non_blocking=True
            )
            queued = True
        elif t.is_cuda:
            out[name] = t.cpu().contiguous()
        else:
            out[name] = t.clone(memory_format=torch.contiguous_format)
    if queued:
        torch.cuda.synchronize()
    return out

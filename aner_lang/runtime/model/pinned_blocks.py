"""Pinned host memory of exactly the size asked, for `offload`'s copies.

torch's caching host allocator rounds every request up to a power of two (its free lists are
kept by `PowerOf2Ceil` sizes), so a copy of 14,337 tokens takes the block of 16,384, and one of
147,456 the block of 262,144: up to twice the host memory, which is what limits how much a
long-context run can keep on the host (`train.budget.host_fit`). These blocks are the bytes
asked.

Rules:

* A block is plain host memory from torch's CPU allocator, its pages touched by torch's threads
  (`zero_`) and then page-locked with `cudaHostRegister`: the way torch's own
  `pinned_use_cuda_host_register` pins, which on an H100 took a third of `cudaHostAlloc`'s time
  and did not hold the GPU back (benchmarks/results/h100_s27_pinned_alloc.json).
* A block comes back to the pool when the tensor handed out on it is freed, and is handed out
  again for a request of its size or up to twice smaller (the smallest such block first). A
  training step asks for the same sizes in the same order every update, so from the second
  update on nothing is pinned afresh.
* A block handed out again may still be read by a copy to the GPU issued before it was freed.
  The callers (`host_copies.HostCopies`) issue every copy in or out of these blocks on one side
  stream per device, so the stream orders the next copy into the block after it; a pool is per
  device for that reason. The host itself never reads or writes a block it has handed out.
* Blocks stay pinned for the life of the process, as torch's cached pinned blocks do, and are
  never unregistered: freeing one would have to wait for every copy that may still read it.
"""

from __future__ import annotations

import weakref
from collections import defaultdict

import torch

_FREE: dict[torch.device, dict[int, list[torch.Tensor]]] = defaultdict(lambda: defaultdict(list))
"""Free blocks (uint8 tensors) by device, then by size in bytes."""
_PINNED: dict[torch.device, int] = defaultdict(int)
"""Bytes pinned by this module per device, free or handed out."""


def pinned_bytes(device: torch.device) -> int:
    """Bytes this process has pinned for `device`'s copies, free or in use."""
    return _PINNED[device]


def empty_like(t: torch.Tensor) -> torch.Tensor:
    """An uninitialised pinned host tensor with `t`'s shape, dtype and strides, on a block of
    exactly its bytes; where `t`'s elements do not fill its span densely (an expanded or sliced
    view), torch's own pinned tensor instead."""
    if not _dense(t):
        return torch.empty_like(t, device="cpu", pin_memory=True)
    nbytes = t.numel() * t.element_size()
    block = _take(t.device, nbytes)
    view = block[:nbytes].view(t.dtype).as_strided(t.shape, t.stride())
    weakref.finalize(view, _give_back, t.device, block)
    return view


def _dense(t: torch.Tensor) -> bool:
    """Whether `t`'s elements fill the span of its strides exactly once from offset 0, as
    `torch.empty_like` lays out a non-overlapping dense tensor."""
    if t.numel() == 0:
        return False
    order = sorted((s, n) for n, s in zip(t.shape, t.stride(), strict=True) if n > 1)
    expected = 1
    for stride, size in order:
        if stride != expected:
            return False
        expected *= size
    return True


def _take(device: torch.device, nbytes: int) -> torch.Tensor:
    """A free block of `device`'s pool of `nbytes` to `2 * nbytes - 1` bytes, the smallest, or a
    new one of exactly `nbytes`."""
    free = _FREE[device]
    fits = [size for size in free if nbytes <= size < 2 * nbytes and free[size]]
    if fits:
        return free[min(fits)].pop()
    block = torch.empty(nbytes, dtype=torch.uint8).zero_()  # pages touched by torch's threads
    status = torch.cuda.cudart().cudaHostRegister(block.data_ptr(), nbytes, 0)
    if int(status) != 0:
        raise RuntimeError(f"cudaHostRegister of {nbytes} bytes failed: {status}")
    _PINNED[device] += nbytes
    return block


def _give_back(device: torch.device, block: torch.Tensor) -> None:
    _FREE[device][block.numel()].append(block)

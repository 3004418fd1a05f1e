"""Summing gradients over ranks in a few large all-reduces instead of one per tensor.

An adapter has hundreds of small tensors (two per target projection and layer); one collective
each would pay the launch latency hundreds of times per update. Tensors are packed, in their
order, into flat buckets of at most `BUCKET_BYTES` per (device, dtype) (DDP's default size), each
bucket summed with one `all_reduce` and unpacked in place. The sum over ranks is exact up to the
order of the additions, which NCCL and gloo fix per world size, so a run is reproducible.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch
import torch.distributed as dist

BUCKET_BYTES = 25 << 20


def buckets(tensors: Iterable[torch.Tensor], limit: int = BUCKET_BYTES) -> list[list[torch.Tensor]]:
    """Consecutive tensors grouped by (device, dtype), each group under `limit` bytes (a tensor
    larger than `limit` is a bucket of its own)."""
    out: list[list[torch.Tensor]] = []
    open_: dict[tuple[torch.device, torch.dtype], tuple[list[torch.Tensor], int]] = {}
    for t in tensors:
        key, size = (t.device, t.dtype), t.nbytes
        group, used = open_.get(key, ([], 0))
        if group and used + size > limit:
            out.append(group)
            group, used = [], 0
        group.append(t)
        open_[key] = (group, used + size)
    out.extend(group for group, _ in open_.values() if group)
    return out


def all_reduce_sum(tensors: Iterable[torch.Tensor], limit: int = BUCKET_BYTES) -> None:
    """Replace every tensor by its sum over all ranks (every rank passes the same shapes in the
    same order)."""
    for group in buckets(tensors, limit):
        flat = torch.cat([t.reshape(-1) for t in group])
        dist.all_reduce(flat, op=dist.ReduceOp.SUM)
        offset = 0
        for t in group:
            n = t.numel()
            t.copy_(flat[offset : offset + n].view_as(t))
            offset += n

"""The memory report: bytes per category for a model or an adapter under a profile.

Counts what Aner itself owns (weights, adapter tensors, optimizer moments, the dequantization tile),
each buffer once (a tied `lm_head` is the embedding), not allocator overhead or process RSS.
In a distributed run the figures are this rank's: the base and data-parallel adapters are whole on
every rank, a `full` adapter's masters and moments are sharded (train/distributed/fsdp.py). The
categories follow the reference qualification report so the figures compare one to one.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import asdict, dataclass, field, fields
from typing import Any

import torch

from aner_lang.host.units import human_bytes
from aner_lang.runtime.io.world import World, world
from aner_lang.runtime.model.linear import FrozenLinear
from aner_lang.runtime.nf4.host_tiled import DEFAULT_TILE_BYTES
from aner_lang.runtime.train.footprint import (
    dequant_tile_bytes,
    managed_optimizer_bytes,
    optimizer_bytes,
)


def _in(section: str) -> Any:
    """A report field shown under `section` when the report is printed."""
    return field(metadata={"section": section})


@dataclass(frozen=True)
class MemoryReport:
    """Byte counts per category (the fields of the Aner `MemoryReport` type).

    Printed (`print(memory(a))`, `str`, interpolation) as a table a person reads: the fields by
    section, each under its Aner field name with its size in binary units."""

    weights: int = _in("base model")
    floating_base: int = _in("base model")
    packed_base: int = _in("base model")
    gpu_packed_base: int = _in("base model")
    adapters: int = _in("adapter")
    frozen_adapter: int = _in("adapter")
    trainable: int = _in("adapter")
    optimizer: int = _in("optimizer")
    managed_optimizer: int = _in("optimizer")
    prefetch_window: int = _in("optimizer")
    dequant_tile: int = _in("kernel buffers")

    def as_dict(self) -> dict[str, int]:
        return asdict(self)

    def __str__(self) -> str:
        lines = ["memory report (bytes Aner holds, each buffer counted once)"]
        section = None
        for f in fields(self):
            if f.metadata["section"] != section:
                section = f.metadata["section"]
                lines.append(f"  {section}")
            lines.append(f"    {f.name:<20} {human_bytes(getattr(self, f.name)):>10}")
        return "\n".join(lines)


def base_bytes(module: torch.nn.Module) -> tuple[int, int, int]:
    """(floating base, packed base, packed base on a GPU) of a base model, each buffer once."""
    floating = packed = gpu_packed = 0
    owned: set[int] = set()
    seen: set[int] = set()
    for m in module.modules():
        if not isinstance(m, FrozenLinear) or id(m) in seen:
            continue
        seen.add(id(m))
        owned.update(id(t) for t in [*m.parameters(recurse=False), *m.buffers(recurse=False)])
        for category, n in m.nbytes().items():
            if category == "packed_base":
                packed += n
                gpu_packed += n if any(b.is_cuda for b in m.buffers(recurse=False)) else 0
            else:
                floating += n
    floating += sum(p.nbytes for p in module.parameters() if id(p) not in owned)
    return floating, packed, gpu_packed


def sharded_count(tensors: Iterable[torch.Tensor], world: World) -> int:
    """Scalars of `tensors` on this rank when each is sharded by rows (FSDP2's chunks)."""
    from aner_lang.runtime.train.distributed.fsdp import rows_on_rank

    return sum(
        rows_on_rank(t.shape[0], world)[1] * (t.numel() // max(t.shape[0], 1)) for t in tensors
    )


def memory_report(target: Any, profile: Any | None = None) -> MemoryReport:
    """The report for a `LoadedModel`, or an adapter through its hooks (docs/internals.md)."""
    is_adapter = hasattr(target, "trainable_count")
    model = target.base if is_adapter else target
    floating, packed, gpu_packed = base_bytes(model.module)
    owned = target.nbytes() if is_adapter else {}
    n_trainable = target.trainable_count if is_adapter else 0
    if is_adapter and getattr(target, "method", "") == "full" and world().size > 1:
        n_trainable = sharded_count(target.params.values(), world())  # this rank's FSDP share
        owned = {"adapters": 4 * n_trainable, "frozen_adapter": 0, "trainable": 4 * n_trainable}
    elif is_adapter and world().size > 1:
        from aner_lang.runtime.train.distributed.base_shards import (
            bytes_not_held,
            shard_base_wanted,
        )

        if shard_base_wanted():  # the NF4 bytes this rank keeps while `train` runs
            elsewhere = bytes_not_held(model.module, world())
            packed -= elsewhere
            gpu_packed -= elsewhere if gpu_packed else 0
    paged = getattr(profile, "optimizer", "adamw") == "paged_adamw" and model.device.type == "cuda"
    managed = managed_optimizer_bytes(
        (t.numel() for t in getattr(target, "params", {}).values()), paged
    )
    fused = profile is not None and profile.resolved_kernel(model.device) == "fused"
    tile = dequant_tile_bytes(
        packed, fused, getattr(profile, "dequant_tile_bytes", DEFAULT_TILE_BYTES)
    )
    return MemoryReport(
        weights=floating + packed,
        floating_base=floating,
        packed_base=packed,
        gpu_packed_base=gpu_packed,
        adapters=owned.get("adapters", 0),
        frozen_adapter=owned.get("frozen_adapter", 0),
        trainable=owned.get("trainable", 0),
        optimizer=optimizer_bytes(n_trainable),
        managed_optimizer=managed,
        prefetch_window=getattr(profile, "page_bytes", 0) if managed else 0,
        dequant_tile=tile,
    )

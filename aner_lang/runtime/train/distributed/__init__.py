"""Training on several ranks with torch.distributed: data parallel adapters, sharded `full`.

Every rank runs the same script (`aner run --nproc N`, or the script under torchrun). `train`
asks `for_run` how to spread an update: in a world of one, `Parallel` changes nothing; a `full`
adapter is sharded with FSDP2 (`fsdp.ShardedFull`); every other adapter is trained data parallel
on a replicated base (`parallel.DataParallel`), or with `ANER_SHARD_BASE=1` on an NF4 base
sharded by rank (`base_shards.ShardedBaseParallel`). docs/distributed.md is the user's guide.
"""

from __future__ import annotations

from typing import Any

from aner_lang.problems.errors import AnerRuntimeError
from aner_lang.runtime.io.world import process_group
from aner_lang.runtime.train.distributed.parallel import DataParallel, Parallel

__all__ = ["DataParallel", "Parallel", "for_run"]


def for_run(adapter: Any, profile: Any, objective: Any = None) -> Parallel:
    """The parallelism a `train` call of `adapter` runs with in this process's world. A
    preference `objective` trains in one process only (its per-pair normalisation and metrics
    are not spread over ranks)."""
    world = process_group()
    if world.size == 1:
        return Parallel(adapter, profile, world)
    if objective is not None:
        raise AnerRuntimeError(
            f"train: the {objective.name} objective runs in one process, not on {world.size} ranks",
            code="E-TRAIN-OPTIONS",
            notes=("run the script without --nproc (or torchrun)",),
        )
    if adapter.method == "full":
        from aner_lang.runtime.train.distributed.fsdp import ShardedFull

        return ShardedFull(adapter, profile, world)
    from aner_lang.runtime.train.distributed.base_shards import (
        ShardedBaseParallel,
        shard_base_wanted,
    )

    if shard_base_wanted():
        return ShardedBaseParallel(adapter, profile, world)
    return DataParallel(adapter, profile, world)

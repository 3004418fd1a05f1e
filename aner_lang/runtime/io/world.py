"""This process's place among the ranks of a distributed run, from torchrun's environment.

torchrun (which `aner run --nproc N` starts) gives every rank `RANK`, `WORLD_SIZE` and
`LOCAL_RANK`; a process started without them is a world of one, and nothing here touches
`torch.distributed` for it.

Rules:

* The process group is created on first use (`process_group()`): NCCL when CUDA is available,
  gloo otherwise. A rank's GPU is `cuda:LOCAL_RANK` (`load.loader.resolve_device`), made the current device
  before any tensor is placed on it, so ranks of one host never share a GPU.
* The process group is destroyed when the interpreter exits (`atexit`, while the interpreter
  is still whole). Left to interpreter finalization, a gloo worker thread that still holds the
  last collective's tensors releases them there, takes the GIL from a finalizing interpreter,
  is ended by it with `pthread_exit`, and the unwinding through a C++ destructor aborts the
  process ("terminate called without an active exception", exit status 1 after a successful
  run).
* Only rank 0 writes files (checkpoints, adapters, exports, event logs): `once(write)` runs
  `write` there and then waits at a barrier, so after the call every rank can read the result.
"""

from __future__ import annotations

import atexit
import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

from aner_lang.problems.errors import AnerRuntimeError

T = TypeVar("T")


@dataclass(frozen=True)
class World:
    """Rank, number of ranks and rank on this host of the running process."""

    rank: int = 0
    size: int = 1
    local_rank: int = 0

    @property
    def main(self) -> bool:
        """Whether this process is the one that prints and writes (rank 0)."""
        return self.rank == 0


def _env_int(name: str, default: int) -> int:
    raw = os.environ.get(name)
    if raw is None:
        return default
    try:
        return int(raw)
    except ValueError:
        raise AnerRuntimeError(
            f"the environment variable {name}={raw!r} is not an integer",
            code="E-DIST-ENV",
            notes=("torchrun sets RANK, WORLD_SIZE and LOCAL_RANK; start ranks with it",),
        ) from None


def world() -> World:
    """The running process's `World` (a world of one outside torchrun)."""
    size = _env_int("WORLD_SIZE", 1)
    rank = _env_int("RANK", 0)
    if size < 1 or not 0 <= rank < size:
        raise AnerRuntimeError(
            f"RANK={rank} and WORLD_SIZE={size} do not describe a rank of a world",
            code="E-DIST-ENV",
        )
    return World(rank, size, _env_int("LOCAL_RANK", 0))


def process_group() -> World:
    """The world, with `torch.distributed`'s default process group created where it has more
    than one rank (once per process)."""
    w = world()
    if w.size == 1:
        return w
    import torch
    import torch.distributed as dist

    if not dist.is_initialized():
        if torch.cuda.is_available():
            torch.cuda.set_device(w.local_rank)
            dist.init_process_group("nccl", device_id=torch.device("cuda", w.local_rank))
        else:
            dist.init_process_group("gloo")
        atexit.register(_destroy)
    return w


def _destroy() -> None:
    """Destroy the default process group if it still exists (the module docstring says why)."""
    import torch.distributed as dist

    if dist.is_initialized():
        dist.destroy_process_group()


def barrier() -> None:
    """Wait until every rank arrives (nothing in a world of one)."""
    if process_group().size > 1:
        import torch.distributed as dist

        dist.barrier()


def once(write: Callable[..., T], *args: Any, **kwargs: Any) -> T | None:
    """`write(*args, **kwargs)` on rank 0 only, then wait for every rank: what it wrote is there
    for all.

    Returns what `write` returned on rank 0 and None elsewhere."""
    result = write(*args, **kwargs) if world().main else None
    barrier()
    return result

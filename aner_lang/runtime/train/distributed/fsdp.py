"""Full fine-tuning sharded over ranks with FSDP2 (`torch.distributed.fsdp.fully_shard`).

Full fine-tuning keeps an fp32 master, its gradient and two AdamW moments per weight: 16 bytes
per parameter, which is what stops a model from fitting one GPU. Sharded, each rank keeps 1/N of
each: every decoder layer (and the root: embeddings, final norm, head) is a `fully_shard` unit
whose parameters are gathered for its forward and backward and freed after, and whose gradients
are reduce-scattered in fp32 after every micro-step's backward (summed, not averaged: the loss is
already normalised over the whole window), so no rank ever holds a whole gradient.

Rules:

* For the length of one `train` call the adapter's masters live in a training copy of the base
  module (`_ShardedAdapter`): the module's structure and buffers deep-copied, its parameters the
  masters, then sharded; the adapter's own whole masters are released meanwhile. `finish`
  gathers the trained masters back into the adapter, so after `train` it is an ordinary `full`
  adapter on every rank (evaluate, save, merge, resume work as in one process).
* Each rank's part of a tensor is FSDP2's: row chunks as `torch.chunk(t, N, dim=0)` gives them
  (a rank past the last chunk holds none). The optimizer updates these parts in place and keeps
  its moments for them only. Rank 0's `TrainState` and so every checkpoint hold whole tensors
  (`gathered`); the other ranks' states hold their parts (`kept`). A whole state is cut into
  this world's parts on resume (`scattered`), so a checkpoint of N ranks resumes on M.
* Mixed precision follows the profile: parameters are gathered in the profile's compute dtype
  (fp32 when it is float32), gradients are reduced in fp32 into fp32 masters. With
  `ANER_FSDP_OFFLOAD=1` the masters, their gradients and the optimizer state stay in host memory
  (`CPUOffloadPolicy`) and only a layer's gathered parameters visit the GPU.
"""

from __future__ import annotations

import copy
import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import torch
from torch import nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import (
    CPUOffloadPolicy,
    FSDPModule,
    MixedPrecisionPolicy,
    OffloadPolicy,
    fully_shard,
    register_fsdp_forward_method,
)
from torch.distributed.tensor import DTensor, Shard

from aner_lang.problems.errors import AnerRuntimeError
from aner_lang.runtime.io.world import World
from aner_lang.runtime.model.precision import DTYPES
from aner_lang.runtime.model.transformer import LlamaModel
from aner_lang.runtime.train.distributed.buckets import all_reduce_sum
from aner_lang.runtime.train.distributed.parallel import CollectiveDataParallel

OFFLOAD_ENV = "ANER_FSDP_OFFLOAD"
_MOMENTS = ("optim/exp_avg/", "optim/exp_avg_sq/")


def offload_wanted() -> bool:
    """Whether `ANER_FSDP_OFFLOAD=1` asks for masters and optimizer state in host memory."""
    return os.environ.get(OFFLOAD_ENV, "0") not in ("", "0")


def rows_on_rank(rows: int, world: World) -> tuple[int, int]:
    """(first row, row count) of rank `world.rank`'s chunk of a tensor of `rows` rows, as FSDP2
    shards it (`torch.chunk` along dim 0: chunks of ceil(rows / N), the last ones short or
    empty)."""
    chunk = -(-rows // world.size)
    start = min(rows, world.rank * chunk)
    return start, min(chunk, rows - start)


def local_part(whole: torch.Tensor, world: World) -> torch.Tensor:
    """Rank `world.rank`'s row chunk of `whole`."""
    start, count = rows_on_rank(whole.shape[0], world)
    return whole.narrow(0, start, count)


class _ShardedAdapter:
    """The `full` adapter as the training loop sees it while its masters are sharded: `params`
    are the sharded masters and `loss` runs the sharded module; the rest is the adapter's."""

    def __init__(
        self, full: Any, module: LlamaModel, kept: Callable[[str, torch.Tensor], torch.Tensor]
    ) -> None:
        self.full, self.module, self._kept = full, module, kept
        self.params: dict[str, torch.Tensor] = dict(module.named_parameters())

    def __getattr__(self, name: str) -> Any:
        return getattr(self.full, name)

    @contextmanager
    def active(self) -> Iterator[None]:
        yield

    def loss(
        self,
        input_ids: torch.Tensor,
        targets: torch.Tensor,
        positions: torch.Tensor | None = None,
    ) -> torch.Tensor:
        return self.module.loss(input_ids, targets, positions)

    def live_tensors(self) -> dict[str, torch.Tensor]:
        """The masters as a `TrainState` keeps them (`ShardedFull.kept`; every rank must call
        this)."""
        return {n: self._kept(n, _local(p)) for n, p in self.params.items()}


class ShardedFull(CollectiveDataParallel):
    """`full` fine-tuning with FSDP2 over the decoder layers (see the module docstring)."""

    graphs_off = "FSDP gathers parameters with collectives inside the step"

    def __init__(self, adapter: Any, profile: Any, world: World) -> None:
        super().__init__(adapter, profile, world)
        base = adapter.base.module
        device = adapter.device
        self.mesh = init_device_mesh(device.type, (world.size,))
        compute = None if profile.precision == "float32" else DTYPES[profile.precision]
        policy = MixedPrecisionPolicy(param_dtype=compute, reduce_dtype=torch.float32)
        offload = offload_wanted()
        if offload and device.type != "cuda":
            raise AnerRuntimeError(
                f"{OFFLOAD_ENV}=1 offloads from a GPU, but this run is on {device.type}",
                code="E-DIST-OFFLOAD",
            )
        placement: OffloadPolicy = CPUOffloadPolicy() if offload else OffloadPolicy()
        memo: dict[int, Any] = {
            id(p): nn.Parameter(adapter.params[n], requires_grad=True)
            for n, p in base.named_parameters()
        }
        module = copy.deepcopy(base, memo)
        for layer in module.layers:
            fully_shard(layer, mesh=self.mesh, mp_policy=policy, offload_policy=placement)
        fully_shard(module, mesh=self.mesh, mp_policy=policy, offload_policy=placement)
        for unit in module.modules():  # the loss is normalised over the window already: sum
            if isinstance(unit, FSDPModule):
                unit.set_gradient_divide_factor(1.0)
                unit.set_force_sum_reduction_for_comms(True)  # a plain SUM (gloo has no PREMUL)
        register_fsdp_forward_method(module, "loss")
        self._sharded = _ShardedAdapter(adapter, module, self.kept)
        with torch.no_grad():  # the adapter's whole masters are released while sharded
            for t in adapter.params.values():
                t.data = t.new_empty(0)

    @property
    def trained(self) -> Any:
        return self._sharded

    def whole(self, name: str, part: torch.Tensor) -> torch.Tensor:
        """The whole tensor of which `part` is this rank's shard, shaped like master `name`, on
        the run's device (a collective: every rank asks for the same names in the same order;
        offloaded shards travel through the GPU, which NCCL needs)."""
        p = self._sharded.params[name]
        local = part.detach().to(self.adapter.device)
        shaped = DTensor.from_local(local, self.mesh, [Shard(0)], shape=p.shape, stride=p.stride())
        return shaped.full_tensor()

    def kept(self, name: str, part: torch.Tensor) -> torch.Tensor:
        """What a `TrainState` keeps of a sharded tensor, in host memory: the whole tensor on rank
        0 (checkpoints are written from it), this rank's part elsewhere (all that a rank needs to
        continue), so the ranks of one host do not each hold a whole copy."""
        whole = self.whole(name, part)
        return whole.cpu() if self.world.main else part.detach().cpu().clone()

    def gradients(self, params: list[tuple[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
        """This rank's part of every gradient (already reduce-scattered by FSDP)."""
        return {n: _local(p.grad) for n, p in params if p.grad is not None}

    def grad_norm(self, grads: dict[str, torch.Tensor]) -> torch.Tensor:
        """The 2-norm of the whole gradients from every rank's parts."""
        squares = torch.stack(
            [torch.linalg.vector_norm(g, dtype=torch.float32) ** 2 for g in grads.values()]
        ).sum()
        squares = squares.to(self.adapter.device)
        all_reduce_sum([squares])
        return squares.sqrt()

    def clip_grad_norm(
        self, params: list[torch.Tensor], grads: dict[str, torch.Tensor], max_norm: float
    ) -> torch.Tensor:
        parts = list(grads.values())
        norm = self.grad_norm(grads)
        coef = torch.clamp(max_norm / (norm + 1e-6), max=1.0)
        torch._foreach_mul_(parts, coef.to(parts[0].device))
        return norm

    def optimizer_params(self, params: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        return {n: _local(p) for n, p in params.items()}

    def gathered(self, tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        out = dict(tensors)
        for key, part in tensors.items():
            name = _moment_of(key)
            if name is not None:
                out[key] = self.kept(name, part)
        return out

    def scattered(self, tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        out = dict(tensors)
        for key, whole in tensors.items():
            name = _moment_of(key)
            p = self._sharded.params.get(name or "")
            if p is not None and whole.shape == p.shape:  # else it is this rank's part already
                out[key] = local_part(whole, self.world).clone()
        return out

    def finish(self) -> None:
        with torch.no_grad():
            for name, p in self._sharded.params.items():
                master = self.adapter.params[name]
                master.data = self.whole(name, _local(p)).to(master.device, torch.float32)


def _local(p: torch.Tensor) -> torch.Tensor:
    return p.to_local() if isinstance(p, DTensor) else p


def _moment_of(key: str) -> str | None:
    """The parameter name of an optimizer moment's state key, None for other keys."""
    for prefix in _MOMENTS:
        if key.startswith(prefix):
            return key[len(prefix) :]
    return None

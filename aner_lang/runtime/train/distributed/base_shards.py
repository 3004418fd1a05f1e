"""NF4 bases sharded by rank (`ANER_SHARD_BASE=1`): each rank keeps 1/N of every decoder layer's
packed NF4 bytes while a data-parallel `train` call runs, and gathers a layer only while it
computes.

A replicated NF4 base costs every rank the whole base (an 8B model about 5.7 GB, a 70B about
38 GB); sharded, a rank keeps its share plus the one or two layers in use, and the room goes to
activations, longer contexts or bigger micro-batches. Nothing is reduced (the base is frozen) and
the gathered bytes are the base's own, so the result is the same bits as a replicated base.

Rules:

* A decoder layer's packed tensors (every `NF4Linear`'s `packed`, `qabsmax` and `absmax2`; the
  shared `code2` and `offset` are a few numbers and stay whole) become views of one flat byte
  buffer per layer, each segment starting on a 16-byte boundary (`layout`). Rank r keeps bytes
  [r*c, (r+1)*c) of it, c = ceil(bytes / N); the buffer's storage exists only while the layer is
  gathered, and gathering is one all-gather of those chunks. The NF4 kernels read the views as
  they read a replicated weight (the fused kernels' argument packs notice the new addresses).
* A layer is gathered before its forward and freed after it. Before its backward (a hook on its
  output's gradient) it is gathered again and stays so until the layer below starts its backward
  (the gradient reaching the layer below means this layer's backward is done) or the backward
  ends. A forward that runs inside the layer's own backward (activation checkpointing's
  recomputation) finds it gathered and leaves it so.
* Every rank gathers the same layers in the same order: every rank runs every micro-step (an
  empty share runs a placeholder that scores nothing, as under FSDP) and every validation.
* CUDA graphs are off (the step allocates, frees and communicates). `restore` (at the end of
  `train`) gathers every layer for good and removes the hooks: afterwards the base is whole on
  every rank, and `evaluate`, `merge` and the exports see an ordinary model.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from functools import partial
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.utils.hooks import RemovableHandle

from aner_lang.problems.errors import AnerRuntimeError
from aner_lang.runtime.io.world import World
from aner_lang.runtime.nf4.linear import NF4Linear
from aner_lang.runtime.train.distributed.parallel import CollectiveDataParallel

SHARD_ENV = "ANER_SHARD_BASE"
# torch 2.13 renamed all_gather_into_tensor (deprecated there); the GPU image's 2.11 has only it
_ALL_GATHER = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
SHARDED = ("packed", "qabsmax", "absmax2")
_ALIGN = 16


def shard_base_wanted() -> bool:
    """Whether `ANER_SHARD_BASE=1` asks for the NF4 base sharded by rank."""
    return os.environ.get(SHARD_ENV, "0") not in ("", "0")


def _tensors(layer: nn.Module) -> Iterator[tuple[NF4Linear, str, torch.Tensor]]:
    for m in layer.modules():
        if isinstance(m, NF4Linear):
            for name in SHARDED:
                yield m, name, m.get_buffer(name)


def layout(layer: nn.Module, ranks: int) -> tuple[list[int], int]:
    """The byte offset of each of the layer's sharded tensors (in `_tensors` order) in its flat
    buffer, and the buffer's size: a multiple of `ranks`, so every rank's chunk is equal."""
    offsets, end = [], 0
    for _, _, t in _tensors(layer):
        offsets.append(end)
        end += -(-t.nbytes // _ALIGN) * _ALIGN
    return offsets, -(-end // ranks) * ranks


def bytes_not_held(module: nn.Module, world: World) -> int:
    """Packed NF4 bytes of the decoder layers that one rank does not keep when they are sharded
    (their bytes less the rank's chunks, which carry the alignment padding): what `memory()`
    takes off the whole base's packed bytes for this rank's figure."""
    layers = list(getattr(module, "layers", []))
    sharded = sum(t.nbytes for layer in layers for *_, t in _tensors(layer))
    return sharded - sum(layout(layer, world.size)[1] for layer in layers) // world.size


class _LayerBytes:
    """One decoder layer's packed NF4 bytes: this rank's chunk, and the flat buffer the layer's
    views live in (its storage allocated only while gathered)."""

    def __init__(self, layer: nn.Module, world: World) -> None:
        offsets, size = layout(layer, world.size)
        found = list(_tensors(layer))
        self.flat = torch.zeros(size, dtype=torch.uint8, device=found[0][2].device)
        for (module, name, t), at in zip(found, offsets):
            segment = self.flat[at : at + t.nbytes]
            segment.copy_(t.detach().reshape(-1).view(torch.uint8))
            module._buffers[name] = segment.view(t.dtype).view(t.shape)
            module._nf4 = None  # drop the NF4Weight that still holds the replicated tensors
        chunk = size // world.size
        self.shard = self.flat[world.rank * chunk : (world.rank + 1) * chunk].clone()
        self.size, self.gathered = size, True
        self.free()

    def gather(self) -> None:
        if not self.gathered:
            self.flat.untyped_storage().resize_(self.size)
            _ALL_GATHER(self.flat, self.shard)
            self.gathered = True

    def free(self) -> None:
        if self.gathered:
            self.flat.untyped_storage().resize_(0)
            self.gathered = False


class ShardedBase:
    """The decoder layers of `module` sharded by rank, gathered around their use (see the module
    docstring)."""

    def __init__(self, module: nn.Module, world: World) -> None:
        layers = list(getattr(module, "layers", []))
        if not layers or any(next(_tensors(layer), None) is None for layer in layers):
            raise AnerRuntimeError(
                f"{SHARD_ENV}=1 shards an NF4 base, and this model's decoder layers are not "
                "stored as NF4",
                code="E-DIST-SHARD",
                notes=("load the model with storage: nf4_double_quant, or unset " + SHARD_ENV,),
            )
        self.layers = [_LayerBytes(layer, world) for layer in layers]
        self.in_backward = [False] * len(layers)
        self.callback_queued = False
        self.handles: list[RemovableHandle] = []
        for i, layer in enumerate(layers):
            self.handles.append(layer.register_forward_pre_hook(partial(self._pre_forward, i)))
            self.handles.append(layer.register_forward_hook(partial(self._post_forward, i)))

    def _pre_forward(self, i: int, _module: nn.Module, _args: Any) -> None:
        self.layers[i].gather()

    def _post_forward(self, i: int, _module: nn.Module, _args: Any, out: torch.Tensor) -> None:
        if self.in_backward[i]:
            return  # recomputed inside this layer's backward: the backward needs the bytes
        if torch.is_grad_enabled() and out.requires_grad:
            out.register_hook(partial(self._pre_backward, i))
        self.layers[i].free()

    def _pre_backward(self, i: int, _grad: torch.Tensor) -> None:
        if not self.callback_queued:
            torch.autograd.Variable._execution_engine.queue_callback(self._end_backward)
            self.callback_queued = True
        if i + 1 < len(self.layers):
            self.in_backward[i + 1] = False
            self.layers[i + 1].free()
        self.layers[i].gather()
        self.in_backward[i] = True

    def _end_backward(self) -> None:
        self.callback_queued = False
        for i, layer in enumerate(self.layers):
            self.in_backward[i] = False
            layer.free()

    def restore(self) -> None:
        """Every layer whole for good, the hooks removed."""
        for layer in self.layers:
            layer.gather()
        for handle in self.handles:
            handle.remove()
        self.handles.clear()


class ShardedBaseParallel(CollectiveDataParallel):
    """Data-parallel adapters over an NF4 base sharded by rank (`ANER_SHARD_BASE=1`)."""

    graphs_off = "the sharded NF4 base is gathered with collectives inside the step"

    def __init__(self, adapter: Any, profile: Any, world: World) -> None:
        super().__init__(adapter, profile, world)
        self.sharded = ShardedBase(adapter.base.module, world)

    def finish(self) -> None:
        self.sharded.restore()

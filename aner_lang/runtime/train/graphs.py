"""A micro-batch's forward and backward replayed from a CUDA graph, one graph per batch shape.

Launching a step's thousands of kernels from Python costs more host time than the GPU needs to
run them at the sizes users train (a QLoRA step of an 8B model is ~10,000 launches). A graph
records them once and replays them with one launch: the GPU no longer waits for the host.

Rules:

* Eager and replay run the same function (`forward_backward`) on the same operands, so their
  results are the same bits; the per-batch numbers it needs (the window's scored-token count, the
  loss scale) are device tensors, written before each replay, never constants of the recording.
* A graph's inputs and gradients live at fixed addresses: the batch (ids, targets, and the
  position ids of packed rows) is copied into the graph's own input tensors, and gradients are
  zeroed in place between windows, never re-allocated. Packed and plain batches of one shape are
  recorded apart.
* Graphs need CUDA and a step without host-side randomness or host round trips: no dropout (its
  masks come from the run's own generator), activations kept or checkpointed (`offload` allocates
  pinned host memory during the step, which a recording cannot). A checkpointed layer's
  recomputation is recorded inside the backward that runs it. Micro-batches long enough to keep
  the GPU busy run eagerly (`EAGER_FROM_TOKENS`). Elsewhere, or when recording fails,
  the step runs eagerly; `GraphSteps.status` says which and why.
* Recording warms the function up once on the graphs' stream first (kernels compiled, workspaces
  allocated), on the micro-batch being recorded: that warm-up is this micro-batch's eager step,
  and its loss and gradients are kept (the same bits a replay gives), so a recorded shape costs
  one recording beside its steps, not a warm-up step thrown away and its gradients put back. The
  gradients are made (zeros) before the warm-up, so the graph accumulates at their addresses.
  Where this process has already warmed up and recorded a step of the same `family` and batch
  shape (a fresh adapter of the same kind on the same model: a sweep's next `train` call), its
  kernels are compiled and its workspaces allocated: the step is recorded straight away and the
  graph replayed for the micro-batch, one eager step fewer. A recording that fails there is
  tried again after a warm-up.
* The graphs record into one memory pool, on the process's graph stream of their device
  (`_stream`), made once: torch keeps a cuBLAS workspace (tens of MiB) for every stream a GEMM
  ever ran on, for the life of the process, so a stream made per `train` call grew the process
  by that much per call. Their transient tensors (a step's activations: GBs at 8B) are free in
  that pool between replays, so eager work between updates (validation) runs there, on that
  stream (`sharing_memory`), instead of allocating as much again beside it. Such work must
  free everything it allocates before it ends: the next replay writes over the pool's free
  blocks. The caching allocator hands a block only to the stream it was allocated on, hence the
  one stream.
* Python's cyclic garbage collector is held off during a recording: a collection inside it could
  destroy an unreachable earlier graph, and freeing device memory invalidates a capture. Before a
  recording it collects the young generations only (`COLLECT_BEFORE_RECORDING`): a full
  collection scans every object of a process that holds a model and the language's modules, 0.1
  to 0.2 s on the CPU (benchmarks/results/cpu_train_fixed_cost.json, `gc_collect_seconds`), once
  per recorded shape and `train` call, while a graph or a step's tensors left unreachable are
  young.
* A `train` call that ends normally keeps its graphs for the next call on the same adapter
  (`train.kept`). A graph holds the reused dequantization buffers it was recorded against
  (`dense_matmul.reused_buffers`), so a buffer grown since is never freed under it.
"""

from __future__ import annotations

import gc
import time
from collections.abc import Callable, Hashable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import torch

from aner_lang.runtime.model import dense_matmul
from aner_lang.runtime.nf4 import host_tiled
from aner_lang.runtime.train.footprint import EAGER_FROM_TOKENS

COLLECT_BEFORE_RECORDING = 1
"""The oldest generation collected before a recording (`gc.collect`'s argument)."""
MAX_SHAPES = 8
"""Shapes recorded at most; a run whose batches keep changing shape runs the rest eagerly."""
_WARMED: set[tuple[object, ...]] = set()
"""The (family, device, batch shape) of every step this process has warmed up and recorded."""

Step = Callable[
    [torch.Tensor, torch.Tensor, torch.Tensor | None, torch.Tensor, torch.Tensor | None],
    torch.Tensor,
]
"""(input_ids, targets, positions of packed rows or None, scored, scale or None) -> the
micro-batch's loss sum / scored."""
_Inputs = tuple[torch.Tensor, torch.Tensor, torch.Tensor | None, torch.Tensor, torch.Tensor | None]
"""A step's arguments."""


@dataclass
class _Graph:
    graph: torch.cuda.CUDAGraph
    ids: torch.Tensor
    targets: torch.Tensor
    positions: torch.Tensor | None
    scored: torch.Tensor
    scale: torch.Tensor | None
    loss: torch.Tensor
    holds: tuple[torch.Tensor, ...]
    """The reused buffers alive at the recording, which the graph may read or write."""


class GraphSteps:
    """Runs `step` for a micro-batch through a recorded graph of its shape, or eagerly."""

    def __init__(
        self,
        step: Step,
        params: list[torch.Tensor],
        reason_off: str | None,
        family: Hashable | None = None,
    ) -> None:
        self.params = params
        self.family = family
        """What makes two `step`s run the same kernels on the same shapes (the module's rules);
        None: each recording warms up first."""
        self._step: Step | None = step
        self.status = "off: " + reason_off if reason_off else "on"
        # `_graphs` before `_memory`: on deletion the graphs release the pool before it goes
        self._graphs: dict[tuple[tuple[int, ...], bool], _Graph] = {}
        self._memory: tuple[torch.cuda.MemPool, torch.cuda.Stream] | None = None
        """The graphs' pool and the stream they record on, made at the first recording."""
        self.recording_seconds = 0.0
        """Host seconds spent recording (the warm-up step excluded), added up since the last
        `take_recording_seconds`."""

    @property
    def on(self) -> bool:
        return self.status == "on"

    @property
    def shapes(self) -> int:
        """Batch shapes recorded so far."""
        return len(self._graphs)

    def adopt(self, step: Step | None) -> None:
        """Record new shapes with `step` (a new call's), replaying the graphs recorded so far;
        None when a call ends (its step is its loop's, which would otherwise live as long as
        graphs kept for the next call, in a reference cycle with them)."""
        self._step = step

    @property
    def step(self) -> Step:
        assert self._step is not None, "a finished call's steps run nothing until adopted"
        return self._step

    def take_recording_seconds(self) -> float:
        """`recording_seconds`, which start again from zero."""
        seconds, self.recording_seconds = self.recording_seconds, 0.0
        return seconds

    def release(self) -> None:
        """Drop the recorded graphs and their memory pool."""
        self._graphs.clear()
        self._memory = None

    @contextmanager
    def sharing_memory(self) -> Iterator[None]:
        """The enclosed eager work allocates from the recorded graphs' pool, on their stream
        (the module's rules); as usual where nothing is recorded yet. Everything it allocates
        must be freed when it ends."""
        if self._memory is None:
            yield
            return
        pool, stream = self._memory
        current = torch.cuda.current_stream()
        stream.wait_stream(current)
        try:
            with torch.cuda.stream(stream), torch.cuda.use_mem_pool(pool):
                yield
        finally:  # the next replay, on `current`, comes after the work it may write over
            current.wait_stream(stream)

    def __call__(
        self,
        ids: torch.Tensor,
        targets: torch.Tensor,
        positions: torch.Tensor | None,
        scored: int,
        scale: float | None,
    ) -> torch.Tensor:
        device = ids.device
        # filled on the device: a host tensor copied there would make the host wait for it
        scored_t = torch.full((), float(scored), dtype=torch.float32, device=device)
        scale_t = (
            None if scale is None else torch.full((), scale, dtype=torch.float32, device=device)
        )
        if not self.on:
            return self.step(ids, targets, positions, scored_t, scale_t)
        key = (tuple(ids.shape), positions is not None)
        g = self._graphs.get(key)
        if g is None:
            if len(self._graphs) >= MAX_SHAPES:
                return self.step(ids, targets, positions, scored_t, scale_t)
            recorded, loss = self._record(ids, targets, positions, scored_t, scale_t)
            if recorded is not None:
                self._graphs[key] = recorded
            return loss  # the warm-up's: this micro-batch's own step
        g.ids.copy_(ids)
        g.targets.copy_(targets)
        if g.positions is not None and positions is not None:
            g.positions.copy_(positions)
        g.scored.copy_(scored_t)
        if g.scale is not None and scale_t is not None:
            g.scale.copy_(scale_t)
        g.graph.replay()
        return g.loss

    def _record(
        self,
        ids: torch.Tensor,
        targets: torch.Tensor,
        positions: torch.Tensor | None,
        scored: torch.Tensor,
        scale: torch.Tensor | None,
    ) -> tuple[_Graph | None, torch.Tensor]:
        """The graph of this batch's shape (None where recording fails) and this micro-batch's
        loss: the warm-up's, which ran its step eagerly, or the new graph's first replay where
        the shape was warm (see the module's rules)."""
        ids_s, targets_s, scored_s = ids.clone(), targets.clone(), scored.clone()
        positions_s = None if positions is None else positions.clone()
        scale_s = None if scale is None else scale.clone()
        inputs: _Inputs = (ids_s, targets_s, positions_s, scored_s, scale_s)
        for p in self.params:  # gradients at fixed addresses, accumulated into by the graph
            if p.grad is None:
                p.grad = torch.zeros_like(p)
        if self._memory is None:
            self._memory = torch.cuda.MemPool(), _stream(ids.device)
        stream = self._memory[1]
        shape = (self.family, ids.device, tuple(ids.shape), positions is not None, scale is None)
        if self.family is not None and shape in _WARMED:
            recorded = self._capture(inputs)
            if isinstance(recorded, _Graph):
                recorded.graph.replay()
                return recorded, recorded.loss
            # recorded again below, after a warm-up
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            warm = self.step(*inputs)
        torch.cuda.current_stream().wait_stream(stream)
        warm.record_stream(torch.cuda.current_stream())  # read there, allocated on `stream`
        # a recording begins by waiting for the device anyway; waiting here keeps the warm-up's
        # device time out of `recording_seconds`
        torch.cuda.synchronize(ids.device)
        recorded = self._capture(inputs)
        if not isinstance(recorded, _Graph):
            self.status = f"off: recording failed ({recorded})"
            return None, warm
        if self.family is not None:
            _WARMED.add(shape)
        return recorded, warm

    def _capture(self, inputs: _Inputs) -> _Graph | str:
        """Record the step on `inputs`, the graph's own, or say why that failed: it runs
        nothing, so the gradients stay as they were."""
        assert self._memory is not None
        pool, stream = self._memory
        stream.wait_stream(torch.cuda.current_stream())
        graph = torch.cuda.CUDAGraph()
        began = time.perf_counter()
        collecting = gc.isenabled()
        gc.collect(COLLECT_BEFORE_RECORDING)
        gc.disable()
        try:
            # a MemPool's id is a graph pool token (torch's stubs type only graph_pool_handle's)
            with torch.cuda.graph(graph, pool=pool.id, stream=stream):  # type: ignore[arg-type]
                loss = self.step(*inputs)
        except RuntimeError as exc:  # an operation that cannot be recorded: run eagerly
            return f"{type(exc).__name__}: {str(exc)[:200]}"
        finally:
            if collecting:
                gc.enable()
            self.recording_seconds += time.perf_counter() - began
        holds = (*dense_matmul.reused_buffers(), *host_tiled.reused_buffers())
        return _Graph(graph, *inputs, loss, holds)


_STREAMS: dict[torch.device, torch.cuda.Stream] = {}


def _stream(device: torch.device) -> torch.cuda.Stream:
    """The process's graph stream on `device` (the module's rules), made at its first use."""
    if device not in _STREAMS:
        _STREAMS[device] = torch.cuda.Stream(device=device)
    return _STREAMS[device]


def eligibility(
    device: torch.device, dropout: float, activations: str, wanted: bool, tokens: int
) -> str | None:
    """None when a run may record its steps of `tokens` tokens per micro-batch; otherwise why
    not, in words for the event log."""
    if not wanted:
        return "the profile turns them off (graphs: false)"
    if device.type != "cuda":
        return f"CUDA graphs need a CUDA device, this run is on {device.type}"
    if dropout > 0:
        return "dropout draws its masks from the run's generator on the host"
    if activations == "offload":
        return "activations: offload allocates pinned host memory during each step"
    if tokens >= EAGER_FROM_TOKENS:
        return (
            f"a micro-batch of {tokens} tokens keeps the GPU busy without them "
            f"(graphs replay micro-batches under {EAGER_FROM_TOKENS} tokens)"
        )
    return None

"""What a training run keeps of the forward pass for backward: everything, or per decoder layer
only its input (activation checkpointing), optionally in pinned host memory.

The choice belongs to a run (a profile's `activations:`), never to the shared base model: a run
enters `keeping(policy)` and `LlamaModel` runs each decoder layer through `run_layer`.

Rules:

* Checkpointing recomputes a layer's forward during backward. The recomputation must see the
  same random numbers as the forward, so the state of every generator the layer draws from is
  captured when the layer runs forward and restored for its recomputation, then put back. A
  decoder layer draws only from the policy's `generators` (the run's dropout generator, named
  there only when dropout is on), never from torch's default generators, whose states torch's
  checkpoint therefore does not save: reading a CUDA generator's state is a host round trip that
  a CUDA graph cannot record. Every context variable (the activation policy, the run's NF4
  backend) is set again too: on CUDA the recomputation runs on autograd's own thread, which does
  not see the forward's. Gradients are therefore bit-identical to keeping everything.
* `offload` keeps the tensors backward needs in pinned host memory (`HostCopies`); with
  checkpointing these are the layer inputs, one `[batch, tokens, hidden]` tensor per layer. The
  copies run on a side stream, ordered by events, so the host never waits for them and the GPU
  computes while they move; backward fetches each layer's input one layer ahead.
* Outside a gradient computation (evaluation, generation) nothing is checkpointed.
* Under `keep`, a cheap elementwise result that a consumer would save for backward can be
  recomputed there instead (`recomputing`), where its inputs are kept anyway: each RMSNorm's
  output (the norm keeps its input), the SwiGLU output (gate and up are kept for the SwiGLU's
  backward) and o_proj's merged copy of the attention heads (attention keeps the heads). Per
  decoder layer that is three hidden-size tensors and an intermediate-size one. The recomputation
  is the same deterministic kernel, so gradients are bit-identical.
"""

from __future__ import annotations

import contextvars
import weakref
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, ExitStack, contextmanager
from dataclasses import dataclass
from typing import Any, cast

import torch
from torch.utils.checkpoint import checkpoint

from aner_lang.builtins import members

MODES = members("Activations")


@dataclass(frozen=True)
class ActivationPolicy:
    mode: str = "keep"
    generators: tuple[torch.Generator, ...] = ()
    """Generators the layers draw from besides torch's defaults (the run's dropout generator)."""

    @property
    def checkpointing(self) -> bool:
        return self.mode in ("checkpoint", "offload")


_KEEP = ActivationPolicy()
_POLICY: contextvars.ContextVar[ActivationPolicy | None] = contextvars.ContextVar(
    "aner_activations", default=None
)


@contextmanager
def keeping(policy: ActivationPolicy) -> Iterator[None]:
    """Run the enclosed forward and backward passes under `policy`."""
    if policy.mode not in MODES:
        raise ValueError(f"unknown activation mode {policy.mode!r}")
    token = _POLICY.set(policy)
    try:
        with ExitStack() as stack:
            if policy.mode == "offload":
                copies = HostCopies()
                stack.enter_context(
                    torch.autograd.graph.saved_tensors_hooks(copies.pack, copies.unpack)
                )
            yield
    finally:
        _POLICY.reset(token)


class _Generators:
    """The recomputation's generator states: those of the forward, restored for the replay."""

    def __init__(self, generators: tuple[torch.Generator, ...]) -> None:
        self.generators = generators
        self.forward_states: list[torch.Tensor] = []

    @contextmanager
    def forward(self) -> Iterator[None]:
        self.forward_states = [g.get_state() for g in self.generators]
        yield

    @contextmanager
    def recompute(self) -> Iterator[None]:
        current = [g.get_state() for g in self.generators]
        for g, state in zip(self.generators, self.forward_states):
            g.set_state(state)
        try:
            yield
        finally:
            for g, state in zip(self.generators, current):
                g.set_state(state)


def run_layer(layer: Callable[..., torch.Tensor], *args: Any) -> torch.Tensor:
    """`layer(*args)`, checkpointed when the enclosing policy says so and gradients are on."""
    policy = _POLICY.get() or _KEEP
    if not policy.checkpointing or not torch.is_grad_enabled():
        return layer(*args)
    states = _Generators(policy.generators)

    def contexts() -> tuple[AbstractContextManager[None], AbstractContextManager[None]]:
        return states.forward(), _replaying(contextvars.copy_context(), states)

    return cast(
        torch.Tensor,
        checkpoint(
            layer, *args, use_reentrant=False, context_fn=contexts, preserve_rng_state=False
        ),
    )


class _Copy:
    """One saved CUDA tensor in pinned host memory: its copy there, and its way back."""

    def __init__(self, host: torch.Tensor, device: torch.device, stored: torch.cuda.Event) -> None:
        self.host, self.device, self.stored = host, device, stored
        self.fetched: tuple[torch.Tensor, torch.cuda.Event] | None = None
        self.before: weakref.ref[_Copy] | None = None
        """The copy packed just before this one: backward is likely to need it next."""


class HostCopies:
    """Saved-tensor hooks that keep every saved CUDA tensor in pinned host memory.

    Rules: a copy in either direction runs on one side stream per device, after an event of the
    stream that produced or will consume the tensor, so neither the host nor the compute stream
    waits for it (`torch.autograd.graph.save_on_cpu` copies to the host synchronously, stalling
    the host once per layer). The device tensor is marked as used by the side stream, so the
    allocator does not hand its memory out before the copy has read it. Unpacking a copy starts
    fetching the copy packed before it, which under checkpointing is the next layer backward
    reaches: its transfer overlaps this layer's backward. CPU tensors are kept as they are."""

    def __init__(self) -> None:
        self._streams: dict[torch.device, torch.cuda.Stream] = {}
        self._last: weakref.ref[_Copy] | None = None

    def _stream(self, device: torch.device) -> torch.cuda.Stream:
        if device not in self._streams:
            self._streams[device] = torch.cuda.Stream(device=device)
        return self._streams[device]

    def pack(self, t: torch.Tensor) -> Any:
        if t.device.type != "cuda":
            return t
        side = self._stream(t.device)
        side.wait_stream(torch.cuda.current_stream(t.device))
        host = torch.empty(t.shape, dtype=t.dtype, layout=t.layout, pin_memory=True)
        with torch.cuda.stream(side):
            host.copy_(t, non_blocking=True)
            stored = torch.cuda.Event()
            stored.record(side)
        t.record_stream(side)
        copy = _Copy(host, t.device, stored)
        copy.before, self._last = self._last, weakref.ref(copy)
        return copy

    def _fetch(self, copy: _Copy) -> tuple[torch.Tensor, torch.cuda.Event]:
        """Start `copy`'s way back to its device; the device tensor and the event of its arrival."""
        side = self._stream(copy.device)
        side.wait_event(copy.stored)
        with torch.cuda.stream(side):
            back = copy.host.to(copy.device, non_blocking=True)
            arrived = torch.cuda.Event()
            arrived.record(side)
        copy.fetched = (back, arrived)
        return copy.fetched

    def unpack(self, packed: Any) -> torch.Tensor:
        if not isinstance(packed, _Copy):
            return cast(torch.Tensor, packed)
        back, arrived = packed.fetched or self._fetch(packed)
        packed.fetched = None
        current = torch.cuda.current_stream(packed.device)
        current.wait_event(arrived)
        back.record_stream(current)
        ahead = packed.before() if packed.before is not None else None
        if ahead is not None and ahead.fetched is None:
            self._fetch(ahead)
        return back


@contextmanager
def _replaying(forward: contextvars.Context, states: _Generators) -> Iterator[None]:
    """A checkpointed layer's recomputation: the forward's generator states, and every context
    variable set again to its value in the forward (`forward`, taken there). The recomputation
    runs where backward runs, on CUDA autograd's own thread, which does not see the context
    variables of the thread that ran the forward: without them `recomputing` would not know it
    is inside a checkpointed layer, and the NF4 matmuls would take the default backend instead
    of the run's."""
    tokens = [(var, var.set(value)) for var, value in forward.items()]
    try:
        with states.recompute():
            yield
    finally:
        for var, token in reversed(tokens):
            var.reset(token)


@dataclass(frozen=True)
class _Recomputed:
    """What a saved tensor is replaced with under `recomputing`: the shape it was saved in."""

    shape: torch.Size


@contextmanager
def recomputing(value: torch.Tensor, compute: Callable[[], torch.Tensor]) -> Iterator[None]:
    """Where the enclosed forward saves `value` for backward (itself, or a contiguous view of all
    of it, as a matmul saves its reshaped input), save nothing and call `compute` (once per
    backward, without gradients) when backward needs it. Only under `keep` with gradients on:
    checkpointing already keeps nothing inside a layer, and `compute` holds its inputs, which a
    checkpointed or offloaded layer must not keep on the device."""
    policy = _POLICY.get() or _KEEP
    if policy.checkpointing or not torch.is_grad_enabled() or not value.is_contiguous():
        yield
        return
    again: list[torch.Tensor] = []
    # torch keeps the pack hook alive with every tensor it saved, until backward releases them,
    # so the hook holds the value's identity, not the value (which would then stay allocated):
    # while the hooks are active the caller holds the value, so nothing else has its address.
    key = (value.data_ptr(), value.numel(), value.dtype, value.device)

    def pack(t: torch.Tensor) -> Any:
        same = t.is_contiguous() and (t.data_ptr(), t.numel(), t.dtype, t.device) == key
        return _Recomputed(t.shape) if same else t

    def unpack(saved: Any) -> torch.Tensor:
        if not isinstance(saved, _Recomputed):
            return cast(torch.Tensor, saved)
        if not again:
            with torch.no_grad():
                again.append(compute())
        return again[0].view(saved.shape)

    with torch.autograd.graph.saved_tensors_hooks(pack, unpack):
        yield

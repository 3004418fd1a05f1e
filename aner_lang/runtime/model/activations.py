"""What a training run keeps of the forward pass for backward: everything, or per decoder layer
only its input (activation checkpointing), optionally in pinned host memory.

The choice belongs to a run (a profile's `activations:`), never to the shared base model: a run
enters `keeping(policy)` and `LlamaModel` runs each decoder layer through `run_layer`.

Rules:

* Checkpointing recomputes a layer's forward during backward. The recomputation must see the
  same random numbers as the forward, so the state of every generator the layer draws from (the
  run's dropout generator; torch's default generators are handled by torch itself) is captured
  when the layer runs forward and restored for its recomputation, then put back. So is every
  context variable (the activation policy, the run's NF4 backend): on CUDA the recomputation runs
  on autograd's own thread, which does not see the forward's. Gradients are therefore
  bit-identical to keeping everything.
* `offload` keeps the tensors backward needs in pinned host memory, copied asynchronously on the
  current stream (`torch.autograd.graph.save_on_cpu`); with checkpointing these are the layer
  inputs, one `[batch, tokens, hidden]` tensor per layer.
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
                stack.enter_context(torch.autograd.graph.save_on_cpu(pin_memory=True))
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
        checkpoint(layer, *args, use_reentrant=False, context_fn=contexts),
    )


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

"""What a training run keeps of the forward pass for backward: everything, or per decoder layer
only its input (activation checkpointing), optionally in pinned host memory.

The choice belongs to a run (a profile's `activations:`), never to the shared base model: a run
enters `keeping(policy)` and `LlamaModel` runs each decoder layer through `run_layer`.

Rules:

* Checkpointing recomputes a layer's forward during backward (`_Checkpoint`). The forward
  builds its autograd graph as usual but every tensor it saves for backward is replaced by an
  empty slot; the first slot backward unpacks runs the layer again from its saved input, fills
  every slot still alive with the tensor saved at the same place, and stops as soon as the last
  one is filled. Backward then runs the forward's own graph on the same values, so gradients
  are bit-identical to keeping everything, and to `torch.utils.checkpoint`'s non-reentrant
  checkpoint, which works the same way but whose first call imports torch._dynamo and
  torch._inductor (seconds of start-up a run has no other use for).
* The recomputation must see the same random numbers as the forward, so the state of every
  generator the layer draws from is captured when the layer runs forward and restored for its
  recomputation, then put back. A decoder layer draws only from the policy's `generators` (the
  run's dropout generator, named there only when dropout is on), never from torch's default
  generators, whose states are therefore not saved: reading a CUDA generator's state is a host
  round trip that a CUDA graph cannot record. The forward's autocast state and every context
  variable (the activation policy, the run's NF4 backend) are set again too: on CUDA the
  recomputation runs on autograd's own thread, which does not see the forward's.
* `offload` keeps the tensors backward needs in pinned host memory (`host_copies`); with
  checkpointing these are the layer inputs, one `[batch, tokens, hidden]` tensor per layer. The
  copies run on a side stream, ordered by events, so the host never waits for them and the GPU
  computes while they move; backward fetches each layer's input one layer ahead. What every
  layer gets alike (the rotary angles, a packing mask) is held as it is, not saved per layer: a
  copy per layer would move the same bytes once per layer (a packing mask's are tokens squared)
  and put them between the layer inputs, whose order the fetching ahead follows.
* Under checkpointing a long micro-batch runs each MLP a tile of tokens at a time (`run_tiled`,
  `chunking.mlp_tile_tokens`), each tile a checkpoint nested in its layer's: the layer's
  recomputation stops once it has the tiles' inputs, and backward recomputes one tile's gate, up
  and product at a time, so a layer's `[tokens, intermediate]` activations never exist whole.
  The tiles' gradients sum over tokens in another order than the whole MLP's, so tiling is not
  bit-identical to the untiled step; a micro-batch within one tile runs untiled, bit for bit.
* A recomputation stops at its layer's last save, so what that save does not need is never
  needed: the product of a layer's last projection (down_proj's, whose adapter saves its input
  and its low-rank product). The model marks that call `last_saves()`; a forward records whether
  its layer saved anything after it, and when nothing, the recomputation lets a frozen product
  be left out (`product_needed`, under adapters whose backward never reads the base output): an
  NF4 or GGUF base saves nothing for it; a 16- or 32-bit one takes the product over no tokens,
  whose node saves what the whole one's does. Forward and backward are unchanged, so gradients
  are the same bits; the product is a sixth of a Llama layer's base GEMMs under checkpointing.
* Under `offload` a checkpointed layer keeps, besides its input, what three calls save and
  return, in pinned host memory, instead of running them again in its recomputation
  (`kept_through_backward`): the projections of the queries, keys and values with their rotary
  positions (their saves and their outputs), attention (what it saved, its output among them)
  and o_proj (its saves and its output). The recomputation fills those calls' slots from what
  was kept (their inputs' slots with the recomputed inputs), takes their outputs from it too,
  and backward runs the forward's own nodes on the same values, so gradients are the same bits.
  Per token and layer that keeps the queries, keys, values, attention's output and o_proj's
  (for Llama-3-8B, 28 KB in bf16 beside the layer input's 8 KB) and spares the recomputation
  the q, k, v and o projections (a fifth of a layer's base GEMMs), their LoRA and the
  rotation, and attention's forward (a fifth of attention's time a step). The copies move on
  the side stream while the forward computes, and backward brings a layer's kept tensors back
  with its input, one layer ahead. A policy's `keeps` names the calls kept (the run picks them
  for its host's memory, `train.footprint.OFFLOAD_KEEPS`); the others run again in the
  recomputation, as under `checkpoint`, to the same bits.
  `checkpoint` recomputes them: it keeps what it saves on the GPU.
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
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from typing import Any, TypeVar, cast

import torch

from aner_lang.builtins import members
from aner_lang.runtime.model.host_copies import HostCopies, HostCopy, held

MODES = members("Activations")
_Out = TypeVar("_Out", torch.Tensor, tuple[torch.Tensor, ...])
"""What a call kept through backward returns: a tensor or a tuple of them."""


@dataclass(frozen=True)
class ActivationPolicy:
    mode: str = "keep"
    generators: tuple[torch.Generator, ...] = ()
    """Generators the layers draw from besides torch's defaults (the run's dropout generator)."""
    keeps: frozenset[str] | None = None
    """Under `offload`, the `kept_through_backward` calls kept, by name (None: all); the others
    run again in the recomputation. The run picks them for the host memory it has
    (`train.footprint.offload_keeps`)."""

    @property
    def checkpointing(self) -> bool:
        return self.mode in ("checkpoint", "offload")


_KEEP = ActivationPolicy()
_POLICY: contextvars.ContextVar[ActivationPolicy | None] = contextvars.ContextVar(
    "aner_activations", default=None
)
_RUNNING: contextvars.ContextVar[_Checkpoint | None] = contextvars.ContextVar(
    "aner_checkpoint", default=None
)
"""The checkpoint whose forward or recomputation is running here (the innermost)."""
_HOST: contextvars.ContextVar[HostCopies | None] = contextvars.ContextVar(
    "aner_host_copies", default=None
)
"""`offload`'s host copies, where a checkpoint keeps attention's saved output
(`kept_through_backward`)."""
_LEAVE_OUT = contextvars.ContextVar("aner_leave_out_product", default=False)
"""Inside `last_saves` during a recomputation that ends there: `product_needed` may say no."""


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
                host = _HOST.set(copies)
                stack.callback(_HOST.reset, host)
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


def run_layer(layer: Callable[..., torch.Tensor], x: torch.Tensor, *shared: Any) -> torch.Tensor:
    """`layer(x, *shared)`, checkpointed when the enclosing policy says so and gradients are on:
    `x`, the layer's own input, is saved for its recomputation through the saved-tensor hooks
    around it (`offload` moves it); `shared`, what every layer gets alike, is held as it is."""
    policy = _POLICY.get() or _KEEP
    if not policy.checkpointing or not torch.is_grad_enabled():
        return layer(x, *shared)
    return _Checkpoint(layer, x, shared, policy.generators).forward()


def run_tiled(
    mlp: Callable[[torch.Tensor], torch.Tensor], x: torch.Tensor, tile_tokens: int
) -> torch.Tensor:
    """`mlp(x)` for a token-wise `mlp`, over tiles of at most `tile_tokens` of `x`'s tokens,
    each checkpointed, when the enclosing policy checkpoints, gradients are on and `x` has more
    tokens than one tile; else `mlp(x)` as it is.

    Every tile's checkpoint saves its input before any tile runs: those saves are the last its
    layer's checkpoint makes, so the layer's recomputation ends there and never runs the MLP,
    which each tile's own recomputation does, one tile at a time."""
    policy = _POLICY.get() or _KEEP
    tokens = x.shape[:-1].numel()
    if not policy.checkpointing or not torch.is_grad_enabled() or tokens <= tile_tokens:
        return mlp(x)
    # one split, not a slice per tile: backward then joins the tiles' input gradients in one
    # pass (SplitBackward), where a slice's backward writes a zero-padded whole for each tile
    tiles = x.reshape(tokens, x.shape[-1]).split(tile_tokens)
    checkpoints = [_Checkpoint(mlp, tile, (), policy.generators) for tile in tiles]
    out = torch.cat([c.forward() for c in checkpoints])
    return out.view(*x.shape[:-1], out.shape[-1])


@contextmanager
def last_saves() -> Iterator[None]:
    """Mark the enclosed call as one whose own output its layer's later computation needs only
    to produce the layer's output, never to save anything (a Llama layer's down projection).

    In a checkpointed layer's forward this records whether the layer saved anything after it.
    Where it did not, the layer's recomputation ends with the saves inside the enclosed call, and
    while it runs `product_needed` lets a frozen product that saves nothing be left out (its
    result is then uninitialized memory that nothing reads). A recomputation that comes out of
    the call without having ended is an error, never gradients from those values."""
    running = _RUNNING.get()
    if running is None:
        yield
    elif not running.replaying:
        yield
        running.last_saves_end = len(running.slots)
    elif not running.ends_in_last_saves:
        yield
    else:
        token = _LEAVE_OUT.set(True)
        try:
            yield
        finally:
            _LEAVE_OUT.reset(token)
        raise RuntimeError(
            "a checkpointed layer's recomputation went on past the call marked as its last saves"
        )


def product_needed(module: torch.nn.Module) -> bool:
    """Whether frozen linear `module` must compute its product: no only inside `last_saves`
    during a recomputation that ends there, and where every forward hook on `module` declares
    `keeps_base_output` false (an adapter whose saves never depend on the base output: what it
    adds to it is computed from the input alone). A forward that leaves it out must still save
    what it would have saved (the recomputation fills the forward's slots in order)."""
    if not _LEAVE_OUT.get():
        return True
    return any(getattr(h, "keeps_base_output", True) for h in module._forward_hooks.values())


def kept_through_backward(
    name: str,
    call: Callable[[], _Out],
    inputs: tuple[torch.Tensor, ...],
    *,
    outputs: bool = False,
) -> _Out:
    """`call()`, an operation of `inputs` returning a tensor or a tuple of tensors, whose saved
    tensors (those that are not its inputs) a checkpointed layer under `offload` keeps through
    backward instead of running the operation again in its recomputation (the module
    docstring's rules). With `outputs`, its outputs are kept too where they are not among its
    saves (a projection's, which the rest of the layer needs); without, the call is kept only
    where its outputs are among its saves (attention's) and otherwise recomputed as usual, as it
    is outside `offload`. `name` is the call's in `train.footprint.OFFLOAD_KEEPS`: a policy whose
    `keeps` leaves it out runs it again in the recomputation instead, in the forward and the
    recomputation alike. Its outputs must not be changed in place afterwards: their copies read
    them beside the computation."""
    running = _RUNNING.get()
    if running is None or running.host is None:
        return call()
    keeps = (_POLICY.get() or _KEEP).keeps
    if keeps is not None and name not in keeps:
        return call()
    if running.replaying:
        return running.replay_kept(call, inputs)
    return running.record_kept(call, inputs, outputs)


def _tensors(result: torch.Tensor | tuple[torch.Tensor, ...]) -> tuple[torch.Tensor, ...]:
    return result if isinstance(result, tuple) else (result,)


def _identity(t: torch.Tensor) -> tuple[Any, ...]:
    """What tells a saved tensor from another: its memory and its view of it."""
    return (t.data_ptr(), t.shape, t.stride(), t.dtype, t.device)


@dataclass(frozen=True)
class _Kept:
    """A call `kept_through_backward` kept: its first slot, and per slot from there the index
    of the input saved there, or None where the slot holds a kept tensor; per output of the
    call, the slot (counted from `start`) holding it, or None where `extras` holds its copy;
    whether the call returned a tuple; the generator states after the call, which its
    recomputation, not running it, must still leave behind."""

    start: int
    roles: tuple[int | None, ...]
    outputs: tuple[int | None, ...]
    extras: list[Any]
    """Per output, its copy where no slot holds it (else None); each dropped once used, so its
    pinned memory goes back while backward goes on."""
    grads: tuple[bool, ...]
    """Per output, whether the forward's required gradients (so the recomputation's later
    operations save what the forward's did)."""
    many: bool
    states: tuple[torch.Tensor, ...]


class _SaveInput(torch.autograd.Function):
    """Saves a checkpointed layer's input for backward, through the saved-tensor hooks active
    around the layer (`offload`'s host copies), and nothing else. Its output is never used: only
    its node's saved tensor is read, by the recomputation."""

    @staticmethod
    def forward(ctx: Any, anchor: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        ctx.save_for_backward(x)
        return anchor.new_empty((0,))

    @staticmethod
    def backward(ctx: Any, *grads: torch.Tensor) -> Any:
        raise AssertionError("a checkpoint's saved input is never differentiated")


class _Slot:
    """What a checkpointed layer's forward saves in place of a tensor: the place its
    recomputation puts the same tensor, until backward unpacks it."""

    __slots__ = ("__weakref__", "saved", "value")

    def __init__(self, t: torch.Tensor) -> None:
        self.saved = (t.shape, t.dtype, t.device)
        """What the forward saved here: the recomputation must save the same."""
        self.value: torch.Tensor | None = None


class _StopRecomputation(Exception):
    """Raised inside a recomputation once every slot is filled: the rest of the layer is not
    needed again."""


class _Checkpoint:
    """One checkpointed call of a layer (the module docstring's rules).

    Rules: the input is saved once, before the layer runs (so `offload` moves it, and only it);
    the shared arguments are held as they are; slots are held weakly, so a slot autograd has
    already released is not filled again; the recomputation runs at most once and frees the saved
    input and the shared arguments after it. A recomputation that
    saves other tensors than the forward (another count, shape, dtype or device: a forward that
    depends on state the replay does not restore) is an error, as is a slot unpacked a second
    time (a second backward through the same graph): never gradients from other values."""

    def __init__(
        self,
        layer: Callable[..., torch.Tensor],
        x: torch.Tensor,
        shared: tuple[Any, ...],
        generators: tuple[torch.Generator, ...],
    ) -> None:
        self.layer, self.shared = layer, shared
        self.x: torch.Tensor | None = x
        self.states = _Generators(generators)
        self.context = contextvars.copy_context()
        self.autocast = [
            (kind, torch.is_autocast_enabled(kind), torch.get_autocast_dtype(kind))
            for kind in dict.fromkeys((x.device.type, "cpu"))
        ]
        self.autocast_cache = torch.is_autocast_cache_enabled()
        anchor = torch.empty((0,), requires_grad=True)  # the saver records a node, always
        self.inputs: torch.Tensor | None = _SaveInput.apply(anchor, x)
        self.slots: list[weakref.ref[_Slot]] = []
        self.replaying = False
        self.last_saves_end: int | None = None
        """How many slots the forward had when its last `last_saves` call ended."""
        self.host = _HOST.get()
        self.kept: list[_Kept | None] = []
        """Per `kept_through_backward` call of the forward, in order: what it kept."""
        self.captured: list[tuple[_Slot, torch.Tensor]] | None = None
        self.filled = 0
        """Slots the recomputation has reached."""
        self.kept_reached = 0
        """`kept_through_backward` calls the recomputation has reached."""

    def forward(self) -> torch.Tensor:
        """`layer(x, *shared)`, its autograd graph saving slots instead of tensors."""
        x, self.x = self.x, None  # from here on only the saved input holds it
        assert x is not None, "a checkpoint runs its forward once"
        with (
            _running(self),
            torch.autograd.graph.saved_tensors_hooks(self._pack, self._unpack),
            self.states.forward(),
        ):
            return self.layer(x, *self.shared)

    @property
    def ends_in_last_saves(self) -> bool:
        """Whether the forward saved nothing after its last `last_saves` call."""
        return self.last_saves_end == len(self.slots)

    def _pack(self, t: torch.Tensor) -> _Slot:
        slot = _Slot(t)
        self.slots.append(weakref.ref(slot))
        if self.captured is not None:
            self.captured.append((slot, t))
        return slot

    def record_kept(
        self, call: Callable[[], _Out], inputs: tuple[torch.Tensor, ...], outputs: bool
    ) -> _Out:
        """The forward's side of `kept_through_backward`: run `call`, then keep in their slots
        the tensors it saved that are not its inputs, and its outputs that are not among them
        (only with `outputs`; without, a call any of whose outputs is not saved keeps nothing)."""
        start, self.captured = len(self.slots), []
        try:
            result = call()
        finally:
            captured, self.captured = self.captured, None
        assert captured is not None
        outs = _tensors(result)
        ids = [_identity(x) for x in inputs]
        saved = [_identity(t) for _, t in captured]
        roles = [ids.index(i) if i in ids else None for i in saved]
        kept = [i if role is None else None for i, role in zip(saved, roles)]
        where = [kept.index(_identity(o)) if _identity(o) in kept else None for o in outs]
        if not outputs and None in where:
            self.kept.append(None)
            return result
        assert self.host is not None
        for (slot, t), role in zip(captured, roles):
            if role is None:
                slot.value = self.host.keep(t)
        self.kept.append(
            _Kept(
                start,
                tuple(roles),
                tuple(where),
                [self.host.keep(o) if n is None else None for o, n in zip(outs, where)],
                tuple(o.requires_grad for o in outs),
                isinstance(result, tuple),
                tuple(g.get_state() for g in self.states.generators),
            )
        )
        return result

    def replay_kept(self, call: Callable[[], _Out], inputs: tuple[torch.Tensor, ...]) -> _Out:
        """The recomputation's side: fill the kept call's input slots with the recomputed
        inputs, bring its kept tensors to the device, and give its kept outputs, without running
        `call` (which runs where the forward kept nothing)."""
        kept = self.kept[self.kept_reached] if self.kept_reached < len(self.kept) else None
        self.kept_reached += 1
        if kept is None:
            return call()
        if self.filled != kept.start:
            raise RuntimeError(
                "a checkpointed layer's recomputation reached a call kept through backward "
                f"after {self.filled} saves, its forward after {kept.start}: its forward is not "
                "deterministic"
            )
        assert self.host is not None
        values: list[torch.Tensor | None] = []
        for role in kept.roles:
            if role is not None:
                values.append(None)
                self._fill(inputs[role])
                continue
            slot = self.slots[self.filled]()
            if slot is None or slot.value is None:
                raise RuntimeError("a kept tensor of a checkpointed layer was released early")
            if not isinstance(slot.value, torch.Tensor):
                slot.value = self.host.unpack(slot.value)
            values.append(slot.value)
            self._fill(None)
        for g, state in zip(self.states.generators, kept.states):
            g.set_state(state)
        outs = []
        for i, (n, extra, grad) in enumerate(zip(kept.outputs, kept.extras, kept.grads)):
            out = self.host.unpack(extra) if n is None else values[n]
            assert out is not None
            kept.extras[i] = None
            outs.append(out.detach().requires_grad_(grad))
        return cast(_Out, tuple(outs) if kept.many else outs[0])

    def _unpack(self, slot: _Slot) -> torch.Tensor:
        if self.inputs is not None:
            self._recompute()
        value, slot.value = slot.value, None
        if value is None:
            raise RuntimeError(
                "a checkpointed layer's saved tensor was unpacked twice "
                "(backward through the same forward twice is not supported)"
            )
        return value

    def _recompute(self) -> None:
        """Run the layer again and fill every live slot with the tensor saved in its place."""
        if self.inputs is None or self.inputs.grad_fn is None:
            raise AssertionError("a checkpoint recomputes once, from its saved inputs")
        (x,) = cast(Any, self.inputs.grad_fn).saved_tensors
        shared, self.inputs, self.shared = self.shared, None, ()
        self.replaying = True
        if self.host is not None:  # bring kept tensors back while the layer recomputes
            slots = (ref() for ref in self.slots)
            values = [slot.value for slot in slots if slot is not None]
            for copy in values + [e for kept in self.kept if kept for e in kept.extras]:
                if isinstance(copy, HostCopy):
                    self.host.prefetch(copy)
        try:
            with ExitStack() as stack:
                stack.enter_context(torch.enable_grad())
                for kind, enabled, dtype in self.autocast:
                    stack.enter_context(
                        torch.autocast(kind, dtype, enabled, cache_enabled=self.autocast_cache)
                    )
                stack.enter_context(_replaying(self.context, self.states))
                stack.enter_context(_running(self))
                stack.enter_context(torch.autograd.graph.saved_tensors_hooks(self._fill, _never))
                self.layer(x, *shared)
        except _StopRecomputation:
            pass
        finally:
            self.kept = []  # what it kept is in the slots now, or no longer needed
        if self.filled != len(self.slots):
            raise RuntimeError(
                f"a checkpointed layer saved {self.filled} tensors when recomputed, "
                f"{len(self.slots)} in its forward: its forward is not deterministic"
            )

    def _fill(self, t: torch.Tensor | None) -> None:
        """The recomputation's pack hook: fill the next slot with `t` (None: the slot holds a
        kept tensor already); stop once every slot is reached. The recomputation's own graph
        keeps nothing (it never runs backward), least of all `t`: a node saving its own output
        would hold itself through it, a reference cycle in C++ no collector sees, and with it
        every tensor the recomputation saved."""
        slot = self.slots[self.filled]() if self.filled < len(self.slots) else None
        self.filled += 1
        if slot is not None and t is not None:
            if (t.shape, t.dtype, t.device) != slot.saved:
                raise _different(f"{tuple(t.shape)} {t.dtype}", slot)
            slot.value = held(t)
        if self.filled >= len(self.slots):
            raise _StopRecomputation


@contextmanager
def _running(checkpoint: _Checkpoint) -> Iterator[None]:
    token = _RUNNING.set(checkpoint)
    try:
        yield
    finally:
        _RUNNING.reset(token)


def _never(packed: None) -> torch.Tensor:
    raise AssertionError("a checkpoint's recomputation is never differentiated")


def _different(recomputed: str, slot: _Slot) -> RuntimeError:
    shape, dtype, _ = slot.saved
    return RuntimeError(
        f"a checkpointed layer's recomputation saved a {recomputed} tensor where its forward "
        f"saved a {tuple(shape)} {dtype} one: its forward is not deterministic"
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
        return _Recomputed(t.shape) if same else held(t)

    def unpack(saved: Any) -> torch.Tensor:
        if not isinstance(saved, _Recomputed):
            return cast(torch.Tensor, saved)
        if not again:
            with torch.no_grad():
                again.append(compute())
        return again[0].view(saved.shape)

    with torch.autograd.graph.saved_tensors_hooks(pack, unpack):
        yield

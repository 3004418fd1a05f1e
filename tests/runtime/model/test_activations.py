"""Activation checkpointing (and offloading) per decoder layer gives bit-identical gradients,
dropout included, and holds less memory for backward."""

from __future__ import annotations

import contextlib
import contextvars
import gc
import threading
import weakref
from collections.abc import Callable, Iterator

import pytest
import torch

from aner_lang.runtime import adapters as A
from aner_lang.runtime.adapters.base import Adapter
from aner_lang.runtime.load.loader import load_model
from aner_lang.runtime.model import activations, host_copies, transformer
from aner_lang.runtime.model.activations import ActivationPolicy, keeping
from aner_lang.runtime.model.loss import IGNORE
from aner_lang.runtime.model.precision import autocast
from aner_lang.runtime.nf4.backends import HostTiled, using_backend
from aner_lang.runtime.nf4.quant import NF4Weight
from aner_lang.runtime.train.footprint import OFFLOAD_KEEPS


@pytest.fixture(scope="module")
def model(tiny_bytes_gguf):
    return load_model(tiny_bytes_gguf, storage="nf4_double_quant", device="cpu")


def _batch(model) -> tuple[torch.Tensor, torch.Tensor]:
    """Two 20-token rows of random ids and their next-token targets (the last one unscored)."""
    ids = torch.randint(
        0, model.config.vocab_size, (2, 20), generator=torch.Generator().manual_seed(2)
    )
    return ids, torch.cat([ids[:, 1:], torch.full((2, 1), IGNORE)], dim=1)


def _device(adapter: Adapter) -> torch.device:
    """Where the adapter (and so the batch and the dropout generator) lives."""
    return next(iter(adapter.params.values())).device


def _grads(
    model,
    mode: str,
    backward: Callable[[torch.Tensor], None] = torch.Tensor.backward,
    keeps: frozenset[str] | None = None,
) -> tuple[dict[str, torch.Tensor], int]:
    adapter = A.lora(
        model, rank=2, alpha=4.0, dropout=0.25, targets=["q_proj", "down_proj"], seed=1
    )
    gen = torch.Generator(device=_device(adapter)).manual_seed(5)
    adapter.dropout_generator = gen
    adapter.train_mode(True)
    ids, targets = (t.to(_device(adapter)) for t in _batch(model))
    saved = 0

    def pack(t: torch.Tensor) -> torch.Tensor:
        nonlocal saved
        saved += t.numel() * t.element_size()
        return t

    # the innermost saved-tensor hooks win: `offload`'s own (inside `keeping`) must see the saves
    with (
        torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t),
        keeping(ActivationPolicy(mode, (gen,), keeps)),
    ):
        with adapter.active():
            backward(adapter.loss(ids, targets))
    return {n: p.grad for n, p in adapter.params.items()}, saved


@pytest.mark.parametrize("mode", ["checkpoint", "offload"])
def test_checkpointed_gradients_are_bit_identical_with_dropout(model, mode, monkeypatch):
    # `keep` runs without recomputation here: its hooks would hide the saves inside them from
    # this count (the innermost saved-tensor hooks win). Its gradients are the same bits with it
    # (test_copies_an_adapter_would_keep_are_recomputed_in_backward).
    monkeypatch.setattr(transformer, "recomputing", lambda *_: contextlib.nullcontext())
    keep, kept_bytes = _grads(model, "keep")
    ours, ours_bytes = _grads(model, mode)
    assert keep.keys() == ours.keys()
    for name, g in keep.items():
        assert torch.equal(g, ours[name]), name
    if mode == "checkpoint":
        assert ours_bytes < kept_bytes / 2


def _torch_checkpoint(layer: Callable[..., torch.Tensor], *args: object) -> torch.Tensor:
    """The oracle: `layer(*args)` under torch.utils.checkpoint's non-reentrant checkpoint, the
    policy's generators and context variables restored for its recomputation."""
    from torch.utils.checkpoint import checkpoint

    policy = activations._POLICY.get()
    assert policy is not None and policy.checkpointing and torch.is_grad_enabled()
    states = activations._Generators(policy.generators)

    def contexts():  # type: ignore[no-untyped-def]
        return states.forward(), activations._replaying(contextvars.copy_context(), states)

    return checkpoint(  # type: ignore[no-any-return]
        layer, *args, use_reentrant=False, context_fn=contexts, preserve_rng_state=False
    )


@pytest.mark.parametrize("mode", ["checkpoint", "offload"])
@pytest.mark.parametrize("precision", ["float32", "bfloat16"])
def test_gradients_are_the_bits_of_torchs_checkpoint(model, mode, precision, monkeypatch):
    """The run's own recomputation against torch.utils.checkpoint's, with dropout, under autocast
    too (the forward runs under it, backward outside it as a run's does: the recomputation must
    run in the forward's autocast state): the same gradients, bit for bit, and the same bytes
    saved for backward but the rotary angles, which torch's saves in every layer and ours holds
    once for all."""
    monkeypatch.setattr(transformer, "recomputing", lambda *_: contextlib.nullcontext())

    def outside_autocast(loss: torch.Tensor) -> None:
        with torch.autocast("cpu", enabled=False):
            loss.backward()

    def grads() -> tuple[dict[str, torch.Tensor], int]:
        with autocast(precision, torch.device("cpu")):
            return _grads(model, mode, backward=outside_autocast)

    ours, ours_bytes = grads()
    monkeypatch.setattr(transformer, "run_layer", _torch_checkpoint)
    theirs, theirs_bytes = grads()
    assert ours.keys() == theirs.keys()
    for name, g in theirs.items():
        assert torch.equal(g, ours[name]), name
    ids, _ = _batch(model)
    angles = 2 * ids.shape[1] * model.config.head_dim * 4  # cos and sin, fp32
    if mode == "offload":  # offload's own hooks, inside the counting ones, take every save
        angles = 0
    assert ours_bytes == theirs_bytes - model.config.num_hidden_layers * angles


def test_a_recomputation_runs_in_the_forwards_autocast_state():
    """A run's forward is under autocast and its backward is not: a checkpointed layer whose
    ops autocast (a float32 matmul run in bfloat16) recomputes in the forward's autocast state,
    so its gradients are the bits of keeping everything."""
    x = torch.randn(4, 8, generator=torch.Generator().manual_seed(0), requires_grad=True)
    w = torch.randn(8, 8, generator=torch.Generator().manual_seed(1), requires_grad=True)

    def layer(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        return torch.tanh(x @ w)

    def grads(mode: str) -> tuple[torch.Tensor | None, torch.Tensor | None]:
        x.grad = w.grad = None
        with keeping(ActivationPolicy(mode)):
            with torch.autocast("cpu", dtype=torch.bfloat16):
                y = activations.run_layer(layer, x, w)
            assert y.dtype == torch.bfloat16
            y.float().square().sum().backward()
        return x.grad, w.grad

    kept = grads("keep")
    ours = grads("checkpoint")
    assert all(a is not None and b is not None and torch.equal(a, b) for a, b in zip(kept, ours))


@pytest.mark.parametrize("change", ["dtype", "count"])
def test_a_recomputation_that_saves_other_tensors_is_an_error(change):
    """A layer whose forward depends on state its replay does not restore (here a flag changed
    between forward and backward) saves other tensors when recomputed: an error naming the
    cause, never gradients from the other values."""
    x = torch.randn(4, 8, generator=torch.Generator().manual_seed(0), requires_grad=True)
    state = {"replay": False}

    def layer(x: torch.Tensor) -> torch.Tensor:
        if state["replay"] and change == "dtype":
            return torch.tanh(x.double()).float()
        if state["replay"]:
            return torch.tanh(x)
        return torch.tanh(torch.sigmoid(x))

    with keeping(ActivationPolicy("checkpoint")):
        y = activations.run_layer(layer, x)
    state["replay"] = True
    with pytest.raises(RuntimeError, match="not deterministic"):
        y.sum().backward()


def test_a_second_backward_through_a_checkpointed_layer_is_an_error(model):
    """A recomputation runs once: backward through the same checkpointed forward again is an
    error naming the cause, never gradients from values recomputed with other random numbers."""
    adapter = A.lora(model, rank=2, alpha=4.0, dropout=0.25, targets=["q_proj"], seed=1)
    adapter.dropout_generator = torch.Generator().manual_seed(5)
    adapter.train_mode(True)
    ids, targets = _batch(model)
    with keeping(ActivationPolicy("checkpoint", (adapter.dropout_generator,))), adapter.active():
        loss = adapter.loss(ids, targets)
        loss.backward(retain_graph=True)
        with pytest.raises(RuntimeError, match="unpacked twice"):
            loss.backward()


def test_a_layers_recomputed_tensors_are_freed_by_its_backward(model, monkeypatch):
    """What a checkpointed layer's recomputation saved is freed once that layer's backward has
    used it: none of it is alive when the next layer recomputes. (The recomputation's own graph
    once held it until the whole backward ended: a layer's activations for every layer.)"""
    layers: list[list[weakref.ref[torch.Tensor]]] = []
    alive: list[int] = []
    recompute = activations._Checkpoint._recompute
    tokens = _batch(model)[0].shape[1]

    def recording(self: activations._Checkpoint) -> None:
        shared = {t.untyped_storage().data_ptr() for t in self.shared if torch.is_tensor(t)}
        recompute(self)
        alive.append(sum(r() is not None for layer in layers for r in layer))
        # the layer's own activations: not the angles every layer shares, nor its weights
        values = [
            s.value for s in (w() for w in self.slots) if s is not None and s.value is not None
        ]
        mine = [v for v in values if v.untyped_storage().data_ptr() not in shared]
        layers.append([weakref.ref(v) for v in mine if tokens in v.shape])

    monkeypatch.setattr(activations._Checkpoint, "_recompute", recording)
    _grads(model, "checkpoint")
    assert len(layers) == model.config.num_hidden_layers and all(layers)
    assert alive == [0] * len(layers)


@pytest.mark.parametrize("mode", ["keep", "offload"])
def test_a_forward_dropped_without_backward_frees_what_it_saved(model, mode, monkeypatch):
    """A step whose forward is dropped without a backward (an error mid-step) frees every tensor
    the hooks kept (`keep`'s recomputed copies, `offload` on the CPU; a checkpoint's forward
    keeps slots, not tensors): held as they are, a node saving its own output (an exp, attention's output)
    would hold itself through it, a cycle in C++ that outlives the step."""
    held: list[weakref.ref[torch.Tensor]] = []
    hold = host_copies.held

    def recording(t: torch.Tensor) -> torch.Tensor:
        kept = hold(t)
        held.append(weakref.ref(kept))
        return kept

    for module in (activations, host_copies):  # keep's recomputed copies; offload's hooks
        monkeypatch.setattr(module, "held", recording)
    adapter = A.lora(model, rank=2, alpha=4.0, targets=["q_proj", "down_proj"], seed=1)
    adapter.train_mode(True)
    ids, targets = _batch(model)
    with keeping(ActivationPolicy(mode)), adapter.active():
        loss = adapter.loss(ids, targets)
    assert loss.requires_grad and held
    del loss
    gc.collect()
    assert [r for r in held if r() is not None] == []


def test_outside_training_nothing_is_checkpointed(model):
    ids = torch.tensor([[1, 2, 3, 4]])
    with keeping(ActivationPolicy("checkpoint")), torch.no_grad():
        assert torch.equal(model.forward(ids), model.forward(ids))


def test_copies_an_adapter_would_keep_are_recomputed_in_backward(model, monkeypatch):
    """Under `keep`, adapters would save both normed inputs (q/k/v and gate/up read them),
    attention's merged heads (o_proj) and the SwiGLU output (down_proj): three hidden-size and
    an intermediate-size tensor per layer. Backward computes each again, once per layer however
    many adapters read it, without gradients, from what the norms, attention and the SwiGLU keep
    anyway, and the gradients are the bits of keeping them."""
    ids, targets = _batch(model)

    def grads() -> dict[str, torch.Tensor]:
        adapter = A.lora(
            model,
            rank=2,
            alpha=4.0,
            targets=["q_proj", "v_proj", "o_proj", "up_proj", "down_proj"],
            seed=1,
        )
        with keeping(ActivationPolicy("keep")), adapter.active():
            adapter.loss(ids, targets).backward()
        return {n: p.grad for n, p in adapter.params.items()}

    recomputed: list[bool] = []

    def counting(value, compute):  # type: ignore[no-untyped-def]
        def again() -> torch.Tensor:
            recomputed.append(torch.is_grad_enabled())
            return compute()

        return activations.recomputing(value, again)

    monkeypatch.setattr(transformer, "recomputing", counting)
    ours = grads()
    assert recomputed == [False] * (4 * model.config.num_hidden_layers)
    monkeypatch.setattr(transformer, "recomputing", lambda *_: contextlib.nullcontext())
    kept = grads()
    assert ours.keys() == kept.keys()
    assert all(torch.equal(g, kept[n]) for n, g in ours.items())


def test_a_recomputed_copy_is_freed_after_the_forward(model, monkeypatch):
    """What `recomputing` leaves out of the saved tensors must not stay allocated some other
    way (torch keeps the hooks with what they saved): once the forward is done, before backward,
    no copy that backward recomputes is alive."""
    values: list[weakref.ref[torch.Tensor]] = []

    def tracking(value, compute):  # type: ignore[no-untyped-def]
        values.append(weakref.ref(value))
        return activations.recomputing(value, compute)

    monkeypatch.setattr(transformer, "recomputing", tracking)
    ids, targets = _batch(model)
    adapter = A.lora(model, rank=2, alpha=4.0, targets=["q_proj", "o_proj", "down_proj"], seed=1)
    with keeping(ActivationPolicy("keep")), adapter.active():
        loss = adapter.loss(ids, targets)
        gc.collect()
        assert len(values) == 4 * model.config.num_hidden_layers
        assert all(ref() is None for ref in values)
        loss.backward()


def _on_another_thread(loss: torch.Tensor) -> None:
    errors: list[BaseException] = []

    def run() -> None:
        try:
            loss.backward()
        except BaseException as e:  # reported by the assertion below
            errors.append(e)

    thread = threading.Thread(target=run)
    thread.start()
    thread.join()
    assert not errors, errors


@pytest.mark.parametrize("mode", ["checkpoint", "offload"])
def test_a_checkpointed_backward_on_another_thread_gives_the_same_gradients(model, mode):
    """On CUDA, backward (and so a checkpointed layer's recomputation) runs on autograd's own
    thread, which does not see the forward thread's context: the recomputation must still save
    what the forward saved, and the gradients must be the bits of keeping everything."""
    keep, _ = _grads(model, "keep")
    ours, _ = _grads(model, mode, backward=_on_another_thread)
    assert keep.keys() == ours.keys()
    for name, g in keep.items():
        assert torch.equal(g, ours[name]), name


class _CountingBackend(HostTiled):
    """host_tiled, recording the `(out, in)` shape of the weight of each forward matmul."""

    def __init__(self) -> None:
        super().__init__()
        self.shapes: list[tuple[int, ...]] = []

    def linear(self, x: torch.Tensor, w: NF4Weight) -> torch.Tensor:
        self.shapes.append(tuple(w.shape))
        return super().linear(x, w)


def _down_shape(model) -> tuple[int, int]:
    return (model.config.hidden_size, model.config.intermediate_size)


def test_a_checkpointed_recomputation_uses_the_runs_nf4_backend(model):
    """The recomputation of a checkpointed layer, on autograd's thread, runs its NF4 projections
    through the run's backend (`using_backend`), not the default one: the same kernels as the
    forward, so the same bits. It runs six of the seven: down_proj's product is the layer's last,
    and no saved tensor needs it (`activations.last_saves`)."""
    counting = _CountingBackend()
    with using_backend(counting):
        _grads(model, "keep")
        kept, counting.shapes = counting.shapes, []
        _grads(model, "checkpoint", backward=_on_another_thread)
    layers = model.config.num_hidden_layers
    assert len(counting.shapes) == len(kept) + 6 * layers
    assert counting.shapes.count(_down_shape(model)) == kept.count(_down_shape(model)) == layers


def _tanh_after_the_mlp(self, x, cos, sin, layer, cache, mask=None):  # type: ignore[no-untyped-def]
    """A decoder layer that saves something computed from its MLP's output (tanh keeps its
    result), as Gemma's post-feedforward norm does."""
    mid = x + transformer._normed(
        self.input_layernorm, x, self.self_attn, cos, sin, layer, cache, mask
    )
    return mid + torch.tanh(transformer._normed(self.post_attention_layernorm, mid, self.mlp))


@pytest.mark.parametrize(
    ("case", "left_out"),
    [
        ("lora, dropout", True),
        ("lora, bfloat16", True),  # one autograd node over the base (lora._OnBases)
        ("dora", False),  # its magnitude's gradient reads the adapted output
        ("saved after the mlp", False),
    ],
)
def test_a_recomputation_leaves_out_down_projs_product_only_where_nothing_needs_it(
    model, case, left_out, monkeypatch
):
    """Checkpointed gradients are the bits of keeping everything in every case; the layer's
    recomputation computes down_proj's product only where a saved tensor depends on it."""
    if case == "saved after the mlp":
        monkeypatch.setattr(transformer.LlamaDecoderLayer, "forward", _tanh_after_the_mlp)
    make = A.dora if case == "dora" else A.lora
    dropout = 0.25 if case == "lora, dropout" else 0.0  # DoRA's takes a second base product
    precision = "bfloat16" if case == "lora, bfloat16" else "float32"

    def grads(mode: str) -> tuple[dict[str, torch.Tensor], list[tuple[int, ...]]]:
        adapter = make(model, rank=2, alpha=4.0, dropout=dropout, targets=["down_proj"], seed=1)
        adapter.dropout_generator = gen = torch.Generator().manual_seed(5)
        adapter.train_mode(True)
        ids, targets = _batch(model)
        counting = _CountingBackend()
        with using_backend(counting), keeping(ActivationPolicy(mode, (gen,))), adapter.active():
            with autocast(precision, torch.device("cpu")):
                loss = adapter.loss(ids, targets)
            loss.backward()
        return {n: p.grad for n, p in adapter.params.items()}, counting.shapes

    kept, kept_shapes = grads("keep")
    ours, shapes = grads("checkpoint")
    for name, g in kept.items():
        assert torch.equal(g, ours[name]), name
    layers = model.config.num_hidden_layers
    down = shapes.count(_down_shape(model)) - kept_shapes.count(_down_shape(model))
    assert down == (0 if left_out else layers)


def test_a_recomputation_that_goes_on_past_its_last_saves_is_an_error():
    """A layer whose forward saved nothing after its `last_saves` call but whose recomputation
    does (state the replay does not restore, here a flag) is an error: its product was left out
    and is not the forward's."""
    x = torch.randn(4, 8, generator=torch.Generator().manual_seed(0), requires_grad=True)
    state = {"replay": False}

    def layer(x: torch.Tensor) -> torch.Tensor:
        if state["replay"]:
            with activations.last_saves():
                y = torch.sigmoid(x)
            return torch.tanh(torch.tanh(y))
        with activations.last_saves():
            return torch.tanh(torch.sigmoid(x))

    with keeping(ActivationPolicy("checkpoint")):
        y = activations.run_layer(layer, x)
    state["replay"] = True
    with pytest.raises(RuntimeError, match="past the call marked as its last saves"):
        y.sum().backward()


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_offloaded_layer_inputs_go_to_the_host_and_come_back_as_the_same_bits(
    tiny_bytes_gguf, monkeypatch, deterministic_cuda
):
    """On CUDA, `offload` moves every checkpointed layer's input to pinned host memory on a side
    stream, and backward fetches it back: the gradients are the bits of keeping everything."""
    cuda = load_model(tiny_bytes_gguf, storage="nf4_double_quant", device="cuda")
    monkeypatch.setattr(transformer, "recomputing", lambda *_: contextlib.nullcontext())
    copies: list[torch.Tensor] = []
    pack = host_copies.HostCopies.pack

    def counting(self, t):  # type: ignore[no-untyped-def]
        packed = pack(self, t)
        if isinstance(packed, host_copies.HostCopy):
            assert packed.host.is_pinned() and packed.host.device.type == "cpu"
            copies.append(packed.host)
        return packed

    monkeypatch.setattr(host_copies.HostCopies, "pack", counting)
    keep, _ = _grads(cuda, "keep")
    ours, _ = _grads(cuda, "offload")
    assert len(copies) >= cuda.config.num_hidden_layers
    for name, g in keep.items():
        assert torch.equal(g, ours[name]), name


@pytest.fixture
def deterministic_cuda() -> Iterator[None]:
    """Deterministic CUDA kernels, as a training run sets them (attention's backward otherwise
    differs in the last bits from one call to the next)."""
    from aner_lang.runtime.train.determinism import deterministic

    with deterministic(torch.device("cuda")):
        yield


def _tiles_without_checkpoints(
    mlp: Callable[[torch.Tensor], torch.Tensor], x: torch.Tensor, tile_tokens: int
) -> torch.Tensor:
    """The oracle of `run_tiled`: the same tiles, in the same order, kept whole for backward."""
    flat = x.reshape(-1, x.shape[-1])
    out = torch.cat([mlp(flat[r : r + tile_tokens]) for r in range(0, len(flat), tile_tokens)])
    return out.view(*x.shape[:-1], out.shape[-1])


def _tile_tokens(model, tokens: int, monkeypatch) -> int:
    """Make the MLPs tile every `tokens` tokens (the tiny model's tiles would hold millions)."""
    from aner_lang.runtime.model import chunking

    width = model.module.layers[0].mlp.intermediate
    monkeypatch.setattr(chunking, "MLP_TILE_BYTES", tokens * width * 4)
    assert chunking.mlp_tile_tokens(width, 4) == tokens
    return tokens


def test_the_tiles_input_gradients_join_in_one_node():
    """`run_tiled` splits its input once, so backward joins the tiles' input gradients in one
    pass, where a slice per tile would write a zero-padded whole input per tile and add them;
    the input's gradient is the tiles' gradients side by side."""
    x = torch.randn(10, 4, requires_grad=True)
    with keeping(ActivationPolicy("checkpoint")):
        out = activations.run_tiled(lambda t: t * t, x, 3)
        names, todo = set(), [out.grad_fn]
        while todo:
            node = todo.pop()
            names.add(type(node).__name__)
            todo += [f for f, _ in node.next_functions if f is not None]
        out.backward(torch.ones_like(out))
    assert "SliceBackward0" not in names
    assert len([n for n in names if n.startswith("Split")]) == 1
    assert torch.equal(x.grad, 2 * x.detach())


@pytest.mark.parametrize("mode", ["checkpoint", "offload"])
def test_a_long_checkpointed_micro_batch_runs_the_mlp_in_tiles(
    model, tiny_bytes_gguf, device, mode, monkeypatch, request
):
    """Each tile checkpointed inside its layer's checkpoint gives the gradients of the same tiles
    kept whole, bit for bit, dropout included (on CUDA, offloaded layer inputs too); and the
    untiled gradients up to the order of the sums over tokens."""
    if device == "cuda":
        request.getfixturevalue("deterministic_cuda")
        model = load_model(tiny_bytes_gguf, storage="nf4_double_quant", device="cuda")
    monkeypatch.setattr(transformer, "recomputing", lambda *_: contextlib.nullcontext())
    untiled, _ = _grads(model, "keep")
    _tile_tokens(model, 7, monkeypatch)  # 40 tokens: five tiles of 7 and one of 5
    tiled, _ = _grads(model, mode)
    monkeypatch.setattr(transformer, "run_tiled", _tiles_without_checkpoints)
    kept_tiles, _ = _grads(model, "keep")
    assert tiled.keys() == kept_tiles.keys() == untiled.keys()
    for name, g in kept_tiles.items():
        assert torch.equal(g, tiled[name]), name
        if device == "cpu":  # CUDA's generator draws other dropout masks per tile than whole
            # fp32 sums over 40 tokens in another order: differences of a few ulps of the largest
            assert (g - untiled[name]).abs().max() <= 1e-5 * untiled[name].abs().max(), name


class _WidestRows(torch.utils._python_dispatch.TorchDispatchMode):
    """The most rows (tokens) of any tensor of `width` columns an op makes, but for `weight`
    (down_proj's shape, dequantized)."""

    def __init__(self, width: int, weight: tuple[int, int]) -> None:
        super().__init__()
        self.width, self.weight, self.rows = width, weight, 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        out = func(*args, **(kwargs or {}))
        for t in out if isinstance(out, (tuple, list)) else (out,):
            if (
                isinstance(t, torch.Tensor)
                and t.dim()
                and t.shape[-1] == self.width
                and tuple(t.shape) != self.weight
            ):
                self.rows = max(self.rows, t.shape[:-1].numel())
        return out


@pytest.mark.parametrize("mode", ["checkpoint", "offload"])
def test_a_tiled_mlp_never_makes_a_whole_micro_batchs_intermediate(model, mode, monkeypatch):
    """Forward and backward (recomputations included): no `[tokens, intermediate]` tensor of more
    tokens than a tile, where the untiled step makes them of all 40."""
    width = model.module.layers[0].mlp.intermediate
    weight = (model.config.hidden_size, width)
    widest = _WidestRows(width, weight)
    with widest:
        _grads(model, mode)
    assert widest.rows == 40
    _tile_tokens(model, 8, monkeypatch)
    widest = _WidestRows(width, weight)
    with widest:
        _grads(model, mode)
    assert widest.rows == 8


def test_outside_checkpointing_the_mlp_runs_whole(model, monkeypatch):
    """Under `keep` (everything is kept anyway) and without gradients (evaluation), no tiles."""
    _tile_tokens(model, 8, monkeypatch)
    width = model.module.layers[0].mlp.intermediate
    kept, evaluated = (_WidestRows(width, (model.config.hidden_size, width)) for _ in range(2))
    with kept:
        _grads(model, "keep")
    ids, _ = _batch(model)
    with evaluated, torch.no_grad(), keeping(ActivationPolicy("checkpoint")):
        model.module(ids)
    assert kept.rows == evaluated.rows == 40


@pytest.mark.parametrize("mode", ["checkpoint", "offload"])
def test_each_tile_runs_twice_and_the_layers_recomputation_none(model, mode, monkeypatch):
    """A tile's MLP runs in the forward and once more in backward: the layer's recomputation
    stops at the tiles' saved inputs, before any tile runs."""
    _tile_tokens(model, 8, monkeypatch)  # 40 tokens: five tiles
    calls = 0
    forward = transformer.LlamaMLP._forward

    def counted(self, x):  # type: ignore[no-untyped-def]
        nonlocal calls
        calls += 1
        return forward(self, x)

    monkeypatch.setattr(transformer.LlamaMLP, "_forward", counted)
    _grads(model, mode)
    assert calls == 2 * 5 * len(model.module.layers)


def test_offload_moves_each_layers_input_and_not_what_layers_share(model, monkeypatch):
    """The rotary angles every layer gets are held once, not copied to the host per layer."""
    packed: list[tuple[int, ...]] = []
    pack = host_copies.HostCopies.pack

    def spy(self, t):  # type: ignore[no-untyped-def]
        packed.append(tuple(t.shape))
        return pack(self, t)

    monkeypatch.setattr(host_copies.HostCopies, "pack", spy)
    _grads(model, "offload")
    ids, _ = _batch(model)
    layer_input = (*ids.shape, model.config.hidden_size)
    assert packed.count(layer_input) >= model.config.num_hidden_layers
    assert (ids.shape[1], model.config.head_dim) not in packed


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_offload_fetches_each_layer_input_once_and_one_layer_ahead(tiny_bytes_gguf, monkeypatch):
    """Backward brings each offloaded copy back once, and every layer's input but the first one
    backward reaches was on its way before its layer's recomputation asked for it, and so was
    everything the layer kept beside it (its queries, keys, values and attention's output)."""
    cuda = load_model(tiny_bytes_gguf, storage="nf4_double_quant", device="cuda")
    ids, _ = _batch(cuda)
    layer_input = (*ids.shape, cuda.config.hidden_size)  # the final norm's input too, first
    fetches: list[int] = []
    ahead: list[bool] = []
    fetch, unpack = host_copies.HostCopies._fetch, host_copies.HostCopies.unpack

    def fetching(self, copy):  # type: ignore[no-untyped-def]
        fetches.append(id(copy))
        return fetch(self, copy)

    def unpacking(self, packed):  # type: ignore[no-untyped-def]
        if isinstance(packed, host_copies.HostCopy) and tuple(packed.host.shape) == layer_input:
            ahead.append(packed.fetched is not None)
        return unpack(self, packed)

    kept_ahead: list[bool] = []
    recompute = activations._Checkpoint._recompute

    def recomputing(self):  # type: ignore[no-untyped-def]
        kept = [s().value for s in self.slots if s() is not None]
        kept = [c for c in kept if isinstance(c, host_copies.HostCopy)]
        kept_ahead.append(bool(kept) and all(c.fetched is not None for c in kept))
        return recompute(self)

    monkeypatch.setattr(host_copies.HostCopies, "_fetch", fetching)
    monkeypatch.setattr(host_copies.HostCopies, "unpack", unpacking)
    monkeypatch.setattr(activations._Checkpoint, "_recompute", recomputing)
    _grads(cuda, "offload")
    assert len(fetches) == len(set(fetches))
    assert len(ahead) >= cuda.config.num_hidden_layers and all(ahead[1:]), ahead
    assert len(kept_ahead) == cuda.config.num_hidden_layers and all(kept_ahead[1:]), kept_ahead


@pytest.mark.parametrize("precision", ["float32", "bfloat16"])
def test_offload_keeps_what_attention_saved_and_never_runs_it_again(
    model, tiny_bytes_gguf, device, precision, monkeypatch, request
):
    """Under `offload` a layer's recomputation takes the rotated queries, keys and values,
    attention's output and o_proj's from what its forward kept (`kept_through_backward`; on CUDA
    in pinned host memory, whatever kernel SDPA picks): the q/k/v projections, attention and
    o_proj run once per layer, not twice as under `checkpoint`, and the gradients are the bits
    of keeping everything, dropout on q_proj (inside the kept projections) and down_proj (after
    them) included. A policy keeping fewer of them (`keeps`, the host's share of
    `OFFLOAD_KEEPS`) runs the others twice, as `checkpoint` does, to the same bits."""
    if device == "cuda":
        request.getfixturevalue("deterministic_cuda")
        model = load_model(tiny_bytes_gguf, storage="nf4_double_quant", device="cuda")
    calls = {"attention": 0, "qkv": 0, "o_proj": 0}
    sdpa = torch.nn.functional.scaled_dot_product_attention
    qkv = transformer.LlamaAttention._qkv
    outputs_of = transformer.outputs_of
    o_projs = {id(layer.self_attn.o_proj) for layer in model.module.layers}

    def attended(*args, **kwargs):  # type: ignore[no-untyped-def]
        calls["attention"] += 1
        return sdpa(*args, **kwargs)

    def projected(self, x):  # type: ignore[no-untyped-def]
        calls["qkv"] += 1
        return qkv(self, x)

    def outputs(x, modules):  # type: ignore[no-untyped-def]
        calls["o_proj"] += sum(id(m) in o_projs for m in modules)
        return outputs_of(x, modules)

    monkeypatch.setattr(torch.nn.functional, "scaled_dot_product_attention", attended)
    monkeypatch.setattr(transformer.LlamaAttention, "_qkv", projected)
    monkeypatch.setattr(transformer, "outputs_of", outputs)
    layers = model.config.num_hidden_layers
    policies = [("keep", None), ("checkpoint", None), ("offload", None)]
    policies += [("offload", frozenset(OFFLOAD_KEEPS[:n])) for n in range(len(OFFLOAD_KEEPS))]
    grads = {}
    for mode, keeps in policies:
        calls = dict.fromkeys(calls, 0)
        with autocast(precision, torch.device(device)):
            grads[mode, keeps], _ = _grads(model, mode, keeps=keeps)
        if mode == "offload":
            kept = set(OFFLOAD_KEEPS if keeps is None else keeps)
            assert calls == {k: layers if k in kept else 2 * layers for k in calls}, keeps
        else:
            assert set(calls.values()) == {layers if mode == "keep" else 2 * layers}
        for name, g in grads["keep", None].items():
            assert torch.equal(g, grads[mode, keeps][name]), (mode, keeps, name)


@pytest.mark.parametrize("storage", ["float32", "float16"])
@pytest.mark.parametrize("precision", ["float32", "bfloat16"])
def test_a_dense_base_leaves_down_projs_product_out_of_its_recomputation_too(
    tiny_bytes_gguf, storage, precision, monkeypatch
):
    """A 16- or 32-bit frozen base (`DenseLinear`) under LoRA: the recomputation takes
    down_proj's product over no tokens, so the node saves what the whole one's did, and the
    gradients are the bits of keeping everything."""
    model = load_model(tiny_bytes_gguf, storage=storage, device="cpu")
    down = (model.config.hidden_size, model.config.intermediate_size)
    rows: list[int] = []
    linear = torch.nn.functional.linear

    def recorded(x, w, *args):  # type: ignore[no-untyped-def]
        if tuple(w.shape) == down:
            rows.append(x.shape[:-1].numel())
        return linear(x, w, *args)

    monkeypatch.setattr(torch.nn.functional, "linear", recorded)

    def grads(mode: str) -> tuple[dict[str, torch.Tensor], list[int]]:
        rows.clear()
        adapter = A.lora(model, rank=2, alpha=4.0, targets=["down_proj"], seed=1)
        adapter.train_mode(True)
        ids, targets = _batch(model)
        with keeping(ActivationPolicy(mode)), adapter.active():
            with autocast(precision, torch.device("cpu")):
                loss = adapter.loss(ids, targets)
            loss.backward()
        return {n: p.grad for n, p in adapter.params.items()}, list(rows)

    kept, kept_rows = grads("keep")
    ours, our_rows = grads("checkpoint")
    for name, g in kept.items():
        assert torch.equal(g, ours[name]), name
    layers = model.config.num_hidden_layers
    assert kept_rows == [40] * layers  # two rows of 20 tokens, once per layer
    assert sorted(our_rows) == [0] * layers + [40] * layers  # recomputed over no tokens

"""The `Adapter` value: trainable fp32 tensors attached to a frozen base model.

Adapters never modify the base. A low-rank adapter adds its delta through forward hooks on the
target `FrozenLinear` modules, and the hooks exist only while that adapter runs (`active()`), so
any number of adapters of one base can be trained and evaluated in turn, and the base model
itself stays exactly the base. `full` keeps its own fp32 copy of every weight and runs the base
module functionally over it. Every adapter offers the forward protocol of docs/internals.md
(`forward`, `tokenizer`, `device`, `base`, `new_cache`), so evaluation and generation work on it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any, cast

import torch
from torch import nn

from aner_lang.problems.errors import AnerRuntimeError
from aner_lang.runtime.io.host_copy import host_copies
from aner_lang.runtime.model.linear import FrozenLinear
from aner_lang.runtime.model.sections import section

_FUSED_NOTE = (
    "this architecture stores q, k and v as one matrix (qkv_proj) and the MLP gate and up as "
    "one (gate_up_proj); an adapter targets those, as PEFT does on it",
)


def target_modules(model: Any, targets: list[str]) -> list[tuple[str, FrozenLinear]]:
    """`(name, FrozenLinear)` of every targeted projection, in model order (layer, then the
    architecture table's projection order, then expert). Target names are the model's
    architecture's: the script checker cannot know the model a file holds, so a target the loaded
    architecture lacks (``q_proj`` on Phi-3) fails here, naming the ones it has; an MLP target of
    a mixture-of-experts layer names every expert's projection (never the router, which stays
    frozen)."""
    arch, config = model.architecture, model.config
    unknown = [t for t in targets if t not in arch.targets]
    if unknown or not targets:
        raise AnerRuntimeError(
            f"unknown adapter target(s) {unknown or '[]'} for a {arch.name} model; expected some "
            f"of {', '.join(arch.targets)}",
            code="E-ADAPTER-TARGET",
            notes=_FUSED_NOTE if arch.fused else (),
        )
    return [
        (name, cast(FrozenLinear, model.module.get_submodule(name)))
        for i in range(config.num_hidden_layers)
        for p in arch.projections
        if p.target in targets
        for name in arch.target_modules(p.target, i, config.experts_in(i))
    ]


class Adapter:
    """Base class: named fp32 masters (`params`), stored frozen tensors, forward protocol.

    Subclasses implement `_delta(index, x)` (the additive output of target `index` for input
    `x`) or override `forward`. `config` is the JSON description that rebuilds the adapter.
    """

    method = "adapter"

    def __init__(self, model: Any, config: dict) -> None:
        self.model = model
        self.config = config
        self.params: dict[str, torch.Tensor] = {}
        self.frozen: dict[str, torch.Tensor] = {}
        self.targets: list[tuple[str, FrozenLinear]] = []
        self.training = False
        self.state: Any = None  # trainer.TrainState once trained
        self.dropout_generator: torch.Generator | None = None
        self._active_depth = 0

    # -- the forward protocol -------------------------------------------------------------
    @property
    def base(self) -> Any:
        return self.model

    @property
    def tokenizer(self) -> Any:
        return self.model.tokenizer

    @property
    def device(self) -> torch.device:
        return self.model.device

    def new_cache(self) -> Any:
        return self.model.new_cache()

    def forward(self, input_ids: torch.Tensor, cache: Any = None) -> torch.Tensor:
        with self.active():
            return self.model.module(input_ids, cache)

    def loss(
        self,
        input_ids: torch.Tensor,
        targets: torch.Tensor,
        positions: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Summed next-token cross-entropy (`LlamaModel.loss`) with this adapter active; while
        training, a mixture-of-experts model's load-balancing loss is added where its config asks
        for it (`router_aux_loss_coef`), as transformers adds it in training."""
        with self.active():
            return self.model.module.loss(input_ids, targets, positions, self.training)

    __call__ = forward

    @contextmanager
    def active(self) -> Iterator[None]:
        """This adapter on its base for the enclosed computation: a forward, and the backward of
        a checkpointed one (which runs decoder layers forward again). Re-entrant: an `active()`
        inside another changes nothing."""
        if self._active_depth:
            self._active_depth += 1
            try:
                yield
            finally:
                self._active_depth -= 1
            return
        with self._attached():
            self._active_depth = 1
            try:
                yield
            finally:
                self._active_depth = 0

    @contextmanager
    def _attached(self) -> Iterator[None]:
        """Hook this adapter's deltas into the base's target modules."""
        handles = [
            module.register_forward_hook(self._hook(i))
            for i, (_, module) in enumerate(self.targets)
        ]
        try:
            yield
        finally:
            for h in handles:
                h.remove()

    def _hook(self, index: int) -> Callable:
        return _DeltaHook(self, index)

    keeps_base_output = False
    """Whether `_apply` saves for backward anything computed from the base output (DoRA's
    scaling does). Where it does not, a checkpoint's recomputation may leave the base product of
    a layer's last projection out (`activations.product_needed`)."""

    def _apply(self, index: int, x: torch.Tensor, base_out: torch.Tensor) -> torch.Tensor:
        return base_out + self._delta(index, x)

    def _delta(self, index: int, x: torch.Tensor) -> torch.Tensor:  # pragma: no cover
        raise NotImplementedError

    shares_input = False
    """Whether `together` can take several targets that read one input at once."""

    def together(self, indices: list[int], x: torch.Tensor) -> list[torch.Tensor] | None:
        """The adapted outputs of targets ``indices``, which all read ``x``, computed together,
        or None where this adapter runs each target alone (then each module's hook applies)."""
        return None

    groups_experts = False
    """Whether `grouped_delta` serves: the adapter can add its deltas of many targets at once (the
    experts of a mixture-of-experts projection, see `moe.MoeMLP`)."""

    def grouped_delta(
        self, indices: list[int], x: torch.Tensor, offs: torch.Tensor
    ) -> torch.Tensor:  # pragma: no cover - only where groups_experts
        """Target ``indices[g]``'s delta of rows ``[offs[g-1], offs[g])`` of ``x``, for every g."""
        raise NotImplementedError

    # -- what the trainer, the memory report and checkpoints read -------------------------
    @property
    def trainable_parameters(self) -> int:
        return sum(p.numel() for p in self.params.values())

    @property
    def target_tensors(self) -> int:
        """How many base tensors this adapter changes (60 for q/v of 30 layers)."""
        return len(self.targets)

    @property
    def trainable_count(self) -> int:
        """Memory report hook (docs/internals.md): number of trainable scalars."""
        return self.trainable_parameters

    def step_config(self) -> dict[str, Any]:
        """Its `config` less `seed`, which only draws the initial values: the settings its
        training step reads (what a recording of the step may hold as constants)."""
        return {k: v for k, v in self.config.items() if k != "seed"}

    def nbytes(self) -> dict[str, int]:
        """Memory report hook: bytes of all adapter tensors, the frozen and the trainable part."""
        trainable = sum(t.nbytes for t in self.params.values())
        frozen = sum(t.nbytes for t in self.frozen.values())
        return {"adapters": trainable + frozen, "frozen_adapter": frozen, "trainable": trainable}

    def tensors(self) -> dict[str, torch.Tensor]:
        """All adapter tensors (trainable and stored frozen), detached CPU copies."""
        return host_copies(self.live_tensors())

    def live_tensors(self) -> dict[str, torch.Tensor]:
        """All adapter tensors as the run holds them, not copies (a snapshot copies them)."""
        return {**self.params, **self.frozen}

    def load_tensors(self, tensors: dict[str, torch.Tensor]) -> None:
        """Copy saved tensors into this adapter (same config), exactly."""
        for name, t in {**self.params, **self.frozen}.items():
            if name not in tensors or tuple(tensors[name].shape) != tuple(t.shape):
                raise AnerRuntimeError(
                    f"adapter tensor {name!r} is missing or has the wrong shape",
                    code="E-ADAPTER-STATE",
                )
            with torch.no_grad():
                t.copy_(tensors[name])

    def train_mode(self, on: bool) -> None:
        self.training = on

    def drops(self, p: float) -> bool:
        """Whether `dropout(x, p)` changes its input now (training, with a positive rate)."""
        return self.training and p > 0.0

    def dropout(self, x: torch.Tensor, p: float) -> torch.Tensor:
        """Inverted dropout with the trainer's generator, so runs are reproducible."""
        if not self.drops(p):
            return x
        keep = torch.empty(x.shape, device=x.device).bernoulli_(
            1 - p, generator=self.dropout_generator
        )
        return x * keep.to(x.dtype) / (1 - p)

    def __repr__(self) -> str:
        return (
            f"Adapter({self.method}, {self.trainable_parameters} trainable, "
            f"{self.target_tensors} target tensors)"
        )


class _DeltaHook:
    """The forward hook that adds target `index`'s delta of `adapter` to its module's output;
    it names both, so a mixture-of-experts layer can run an adapter's deltas of all its experts
    at once instead (`grouped_delta`)."""

    def __init__(self, adapter: Adapter, index: int) -> None:
        self.adapter, self.index = adapter, index

    @property
    def keeps_base_output(self) -> bool:
        """What `activations.product_needed` asks of a module's hooks."""
        return self.adapter.keeps_base_output

    def __call__(self, _module: nn.Module, args: tuple, output: torch.Tensor) -> torch.Tensor:
        with section("lora"):
            return self.adapter._apply(self.index, args[0], output)

    def together(self, x: torch.Tensor, hooks: Sequence[object]) -> list[torch.Tensor] | None:
        """The outputs of the modules that ``hooks`` (this one first) are the only hooks of,
        all on input ``x``, where they are one adapter's and it takes them together
        (`linear.outputs_of`); else None."""
        mine = [h for h in hooks if isinstance(h, _DeltaHook) and h.adapter is self.adapter]
        if len(mine) < len(hooks) or not self.adapter.shares_input:
            return None
        return self.adapter.together([h.index for h in mine], x)

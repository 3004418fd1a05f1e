"""Merging an adapter into its base.

`merge(adapter)` gives a plain dense `LoadedModel` whose every projection is the exact linear map
the adapter computes (dequantized NF4 + delta, in fp32), so nothing trained is lost to a
re-quantization. The effective weight of a target is read by running the adapter's own hook on
the identity matrix: for any adapter that is linear in its input (LoRA, LoRA-FA, DoRA, TinyLoRA)
that is exactly ``W'^T``, so merge needs no per-method formula that could drift from training.
"""

from __future__ import annotations

import copy
import dataclasses
from typing import Any

import torch

from aner_lang.problems.errors import AnerRuntimeError
from aner_lang.runtime.model.linear import DenseLinear, FrozenLinear


def effective_weights(adapter: Any) -> dict[str, torch.Tensor]:
    """`{module name: W'}` for every target of a linear adapter, in fp32 on the CPU."""
    out: dict[str, torch.Tensor] = {}
    was_training = adapter.training
    adapter.train_mode(False)
    try:
        with torch.no_grad():
            for index, (name, module) in enumerate(adapter.targets):
                eye = torch.eye(module.in_features, device=adapter.device)
                w_t = adapter._apply(index, eye, module(eye))
                out[name] = w_t.float().t().contiguous().cpu()
    finally:
        adapter.train_mode(was_training)
    return out


def _dense_clone(model: Any, weights: dict[str, torch.Tensor]) -> Any:
    """A copy of `model` with every FrozenLinear dense fp32 (`weights` override by name)."""
    module = copy.deepcopy(model.module).cpu()
    replaced: dict[int, DenseLinear] = {}
    for parent_name, parent in list(module.named_modules()):
        for child_name, child in list(parent._modules.items()):  # tied children too
            if not isinstance(child, FrozenLinear):
                continue
            full = f"{parent_name}.{child_name}" if parent_name else child_name
            if id(child) not in replaced:  # tied embeddings: one new module for both names
                w = weights.get(full)
                replaced[id(child)] = DenseLinear(w if w is not None else child.dense_weight())
            setattr(parent, child_name, replaced[id(child)])
    return dataclasses.replace(
        model, module=module.to(model.device), storage="float32", metadata=dict(model.metadata)
    )


def merge(adapter: Any) -> Any:
    """The adapter folded into its base: a dense float32 `Model` with the same logits."""
    if getattr(adapter, "method", None) == "full":  # its masters are the merged weights
        merged = _dense_clone(adapter.base, {})
        with torch.no_grad():
            for name, t in adapter.params.items():
                merged.module.get_parameter(name).copy_(t)
        return merged
    if not hasattr(adapter, "targets"):
        raise AnerRuntimeError(
            "merge needs an adapter (from lora, lora_fa, tinylora, dora or full)", code="E-MERGE"
        )
    return _dense_clone(adapter.base, effective_weights(adapter))

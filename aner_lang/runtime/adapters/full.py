"""Full fine-tuning: every weight of the base becomes a trainable fp32 master.

The masters are this adapter's own copies, so the base model (and every other adapter of it)
is untouched; during this adapter's forward the base module's parameter slots point at the
masters and are put back afterwards (`torch.func.functional_call` does not restore a module that
appears under two names, as tied embeddings do, so we swap each module's slot exactly once). Tied
embeddings stay one tensor. NF4 storage is rejected: a packed 4-bit base has no weights to train.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch

from aner_lang.problems.errors import AnerRuntimeError
from aner_lang.runtime.adapters.base import Adapter


class Full(Adapter):
    """All 272 tensors of SmolLM2 (134,515,008 numbers) trained."""

    method = "full"

    def __init__(self, model) -> None:
        if model.storage not in ("float32", "float16"):
            raise AnerRuntimeError(
                f"full fine-tuning needs a dense base, but this model is stored as {model.storage}",
                code="E-FULL-NF4",
                notes=(
                    "load the model with storage: float32 (or float16) for full",
                    "or train a lora/lora_fa/dora/tinylora adapter on the NF4 base",
                ),
            )
        super().__init__(model, {"method": self.method})
        self._slots = []  # (module, attribute, master): each module once, tied or not
        for name, p in model.module.named_parameters():
            self.params[name] = p.detach().to(torch.float32, copy=True).requires_grad_(True)
            owner, _, attr = name.rpartition(".")
            self._slots.append((model.module.get_submodule(owner), attr, self.params[name]))

    @property
    def target_tensors(self) -> int:
        return len(self.params)

    @contextmanager
    def _attached(self) -> Iterator[None]:
        saved = [(module, attr, module._parameters[attr]) for module, attr, _ in self._slots]
        try:
            for module, attr, master in self._slots:
                module._parameters[attr] = master
            yield
        finally:
            for module, attr, original in saved:
                module._parameters[attr] = original

"""Full fine-tuning: every weight of the base becomes a trainable fp32 master.

The masters are this adapter's own copies, so the base model (and every other adapter of it)
is untouched; the forward runs the base module functionally over them (`torch.func`). Tied
embeddings stay one tensor. NF4 storage is rejected: a packed 4-bit base has no weights to train.
"""

from __future__ import annotations

import torch
from torch.func import functional_call

from aner_lang.errors import AnerRuntimeError
from aner_lang.runtime.adapters.base import Adapter


class Full(Adapter):
    """All 272 tensors of SmolLM2 (134,515,008 numbers) trained."""

    method = "full"

    def __init__(self, model) -> None:
        if model.storage not in ("float32", "float16"):
            raise AnerRuntimeError(
                f"full fine-tuning needs a dense base, but this model is stored as "
                f"{model.storage}", code="E-FULL-NF4",
                notes=("load the model with storage: float32 (or float16) for full",
                       "or train a lora/lora_fa/dora/tinylora adapter on the NF4 base"))
        super().__init__(model, {"method": self.method})
        for name, p in model.module.named_parameters():
            self.params[name] = p.detach().to(torch.float32, copy=True).requires_grad_(True)

    @property
    def target_tensors(self) -> int:
        return len(self.params)

    def forward(self, input_ids: torch.Tensor, cache=None) -> torch.Tensor:
        return functional_call(self.model.module, self.params, (input_ids, cache))

    __call__ = forward

"""`LoadedModel`: what an Aner `Model` value is (the torch module, its tokenizer and its origin)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from aner_lang.architectures import ARCHITECTURES, Architecture
from aner_lang.host.model_paths import hub_repo
from aner_lang.runtime.model.config import ModelConfig
from aner_lang.runtime.model.linear import FrozenLinear
from aner_lang.runtime.model.tokenizer import Tokenizer
from aner_lang.runtime.model.transformer import KVCache, LlamaModel, RMSNorm

_SOURCE_KEYS = (
    "general.source.repo_url",
    "general.source.url",
    "general.source.huggingface.repository",
)
"""GGUF metadata naming the repository a model was converted from, most specific first."""


@dataclass
class LoadedModel:
    """A base model ready to run: the torch module, its tokenizer and where it came from.

    Offers the forward protocol of docs/internals.md (`forward`, `tokenizer`, `device`, `base`),
    so generation and evaluation treat it and an adapter alike.
    """

    module: LlamaModel
    tokenizer: Tokenizer
    config: ModelConfig
    path: Path
    storage: str
    device: torch.device
    metadata: dict[str, Any]
    """A GGUF's scalar metadata, or a folder's config.json."""
    rope_freqs: torch.Tensor | None = None
    """Per-frequency rope divisors (Llama 3 scaling), written back to GGUF as ``rope_freqs``."""

    @property
    def architecture(self) -> Architecture:
        """The table of facts about this model's tensors (names, permutations, targets)."""
        return ARCHITECTURES[self.config.architecture]

    @property
    def base(self) -> LoadedModel:
        return self

    def forward(self, input_ids: torch.Tensor, cache: KVCache | None = None) -> torch.Tensor:
        return self.module(input_ids, cache)

    def loss(
        self,
        input_ids: torch.Tensor,
        targets: torch.Tensor,
        positions: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Summed next-token cross-entropy over `targets` (`LlamaModel.loss`)."""
        return self.module.loss(input_ids, targets, positions)

    def new_cache(self) -> KVCache:
        return self.module.new_cache()

    @property
    def name(self) -> str:
        """The model's own name: a GGUF's ``general.name`` (or ``general.basename``), a folder's
        ``_name_or_path``, else the file's stem or the folder's name."""
        for key in ("general.name", "general.basename", "_name_or_path"):
            if isinstance(self.metadata.get(key), str) and self.metadata[key]:
                return str(self.metadata[key])
        return self.path.name if self.path.is_dir() else self.path.stem

    @property
    def reference(self) -> str:
        """What another tool loads this model by (a PEFT export's `base_model_name_or_path`).

        A GGUF whose metadata names the Hugging Face repository it was converted from
        (`general.source.repo_url`, `general.source.url`, or the older
        `general.source.huggingface.repository`) is referred to by that repository's id, which
        transformers and PEFT load. Otherwise the absolute path of the file or folder it was
        loaded from: a folder loads in transformers, a GGUF in Aner, llama.cpp and transformers
        (with `gguf_file=`). Never `general.base_model.*`: that names the model this one was
        fine-tuned from, not this one; nor `general.name`, a display name no tool loads."""
        if not self.path.is_dir():
            for key in _SOURCE_KEYS:
                repo = hub_repo(self.metadata.get(key))
                if repo is not None:
                    return repo
        return str(self.path.absolute())

    @property
    def source_architecture(self) -> str:
        """The architecture the file names: GGUF ``general.architecture`` or a folder's
        ``model_type`` (``mistral`` is read with the ``llama`` table)."""
        return str(self.metadata.get("general.architecture") or self.metadata.get("model_type"))

    def parameter_count(self) -> int:
        """Weights of the model as a dense network (tied embeddings counted once)."""
        seen: set[int] = set()
        total = 0
        for m in self.module.modules():
            if id(m) in seen:
                continue
            seen.add(id(m))
            if isinstance(m, FrozenLinear):
                total += m.in_features * m.out_features
            elif isinstance(m, RMSNorm):
                total += m.weight.numel()
        return total

    def __repr__(self) -> str:
        return f'Model("{self.name}", {self.config.num_hidden_layers} layers, {self.storage})'

"""Builtins that describe a model or use only its tokenizer: `model_info`, `tokenize`,
`detokenize`. They accept a `LoadedModel` or anything with a `.base` that is one (an adapter)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from aner_lang.interp.values import record_text
from aner_lang.runtime.model.loaded import LoadedModel


@dataclass(frozen=True)
class ModelInfo:
    """What `model_info(model)` reports (the fields of the Aner ModelInfo type)."""

    name: str
    architecture: str
    parameters: int
    layers: int
    hidden_size: int
    intermediate_size: int
    heads: int
    kv_heads: int
    vocab_size: int
    context_length: int
    rope_theta: float
    rms_norm_eps: float
    tied_embeddings: bool
    storage: str
    device: str

    def __str__(self) -> str:
        return record_text(self)


def model_info(model: Any) -> ModelInfo:
    """Builtin `model_info(model)`: the hyper-parameters of a model (or an adapter's base)."""
    base: LoadedModel = model.base
    c = base.config
    return ModelInfo(
        name=base.name,
        architecture=base.source_architecture,
        parameters=base.parameter_count(),
        layers=c.num_hidden_layers,
        hidden_size=c.hidden_size,
        intermediate_size=c.intermediate_size,
        heads=c.num_attention_heads,
        kv_heads=c.num_key_value_heads,
        vocab_size=c.vocab_size,
        context_length=c.max_position_embeddings,
        rope_theta=c.rope_theta,
        rms_norm_eps=c.rms_norm_eps,
        tied_embeddings=c.tie_word_embeddings,
        storage=base.storage,
        device=str(base.device),
    )


def tokenize(model: Any, text: str, special: bool) -> list[int]:
    """Builtin `tokenize(model, text, special:)`: BOS added when the vocabulary asks for it;
    `special` also matches special-token text such as ``<|im_end|>``."""
    return model.tokenizer.encode(text, add_special=True, parse_special=special)


def detokenize(model: Any, tokens: list[int]) -> str:
    """Builtin `detokenize(model, tokens)`."""
    return model.tokenizer.decode(tokens)

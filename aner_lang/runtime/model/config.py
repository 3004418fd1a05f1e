"""Model hyper-parameters, named as in Hugging Face configs, and where they come from in a file."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from aner_lang.architectures import ARCHITECTURES, for_gguf
from aner_lang.errors import AnerRuntimeError

if TYPE_CHECKING:
    from aner_lang.runtime.io.gguf import GGUFFile


@dataclass(frozen=True)
class LlamaConfig:
    """Model hyper-parameters, named as in HF `LlamaConfig`."""

    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    rms_norm_eps: float = 1e-5
    rope_theta: float = 10000.0
    max_position_embeddings: int = 2048
    tie_word_embeddings: bool = True
    architecture: str = "llama"
    """The key of this model's table in `aner_lang.architectures.ARCHITECTURES`."""

    @property
    def q_size(self) -> int:
        return self.num_attention_heads * self.head_dim

    @property
    def kv_size(self) -> int:
        return self.num_key_value_heads * self.head_dim

    def dims(self, fields: tuple[str, str]) -> tuple[int, int]:
        """A weight's ``[out, in]`` shape from the config fields an architecture table names."""
        return int(getattr(self, fields[0])), int(getattr(self, fields[1]))


def config_from_gguf(gguf: GGUFFile) -> LlamaConfig:
    """The model's hyper-parameters (HF config names); raises for an architecture without a
    table in `aner_lang.architectures`."""
    arch = gguf.architecture
    table = for_gguf(arch)
    if table is None:
        known = ", ".join(a for t in ARCHITECTURES.values() for a in t.gguf_architectures)
        raise AnerRuntimeError(
            f"{gguf.path}: unsupported model architecture {arch!r}: Aner loads {known} GGUF files",
            code="E-GGUF-ARCH",
        )
    p = f"{arch}."
    hidden = int(gguf.require(p + "embedding_length"))
    heads = int(gguf.require(p + "attention.head_count"))
    kv_heads = int(gguf.metadata.get(p + "attention.head_count_kv", heads))
    if heads <= 0 or kv_heads <= 0 or heads % kv_heads or hidden % heads:
        raise AnerRuntimeError(
            f"{gguf.path}: inconsistent attention shape: {heads} heads, "
            f"{kv_heads} KV heads, hidden size {hidden}",
            code="E-GGUF-METADATA",
        )
    vocab = gguf.metadata.get(p + "vocab_size")
    if vocab is None:
        vocab = len(gguf.require("tokenizer.ggml.tokens"))
    return LlamaConfig(
        vocab_size=int(vocab),
        hidden_size=hidden,
        intermediate_size=int(gguf.require(p + "feed_forward_length")),
        num_hidden_layers=int(gguf.require(p + "block_count")),
        num_attention_heads=heads,
        num_key_value_heads=kv_heads,
        head_dim=int(gguf.metadata.get(p + "attention.key_length", hidden // heads)),
        rms_norm_eps=float(gguf.metadata.get(p + "attention.layer_norm_rms_epsilon", 1e-5)),
        rope_theta=float(gguf.metadata.get(p + "rope.freq_base", 10000.0)),
        max_position_embeddings=int(gguf.metadata.get(p + "context_length", 2048)),
        tie_word_embeddings=not gguf.has_tensor(table.output),
        architecture=table.name,
    )

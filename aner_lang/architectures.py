"""The one registry of model architectures: every fact about an architecture's tensors, as data.

A model file names its tensors in its own scheme (GGUF: ``blk.3.attn_q.weight``; Hugging Face:
``model.layers.3.self_attn.q_proj.weight``) and may store some of them permuted (llama.cpp's
converter interleaves the rotary halves of the q/k rows). Loading, adapters, merging, PEFT and
GGUF export all need these facts; they read them here, so a new architecture is one table, and
the front end (the `Target` enum of the builtin registry) reads the same table without torch.

Rules:

* Module names are Hugging Face's (``layers.{i}.self_attn.q_proj``), because adapters export to
  PEFT, which addresses modules by those names.
* A projection whose GGUF rows are permuted names the config field holding its head count
  (``num_attention_heads`` for q, ``num_key_value_heads`` for k); the permutation itself is
  `aner_lang.runtime.io.gguf.permute_rows` / `unpermute_rows`.
* The order of `projections` is the order adapters visit targets within a layer (attention,
  then MLP), which fixes the order their seeded initialisations are drawn in.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Projection:
    """One weight matrix of a decoder layer that an adapter can target."""

    target: str
    """The Hugging Face module name, which is also the Aner `Target` member (``q_proj``)."""
    block: str
    """The submodule of the decoder layer holding it: ``self_attn`` or ``mlp``."""
    gguf: str
    """The GGUF tensor stem (``attn_q`` in ``blk.{i}.attn_q.weight``)."""
    shape: tuple[str, str]
    """Config fields giving the weight's ``[out, in]`` shape (``q_size``, ``hidden_size``)."""
    doc: str
    rope_heads: str | None = None
    """Config field with the head count llama.cpp's converter permuted this weight's rows by."""

    def module(self, layer: int) -> str:
        """The module's name in the model (``layers.3.self_attn.q_proj``)."""
        return f"layers.{layer}.{self.block}.{self.target}"

    def gguf_tensor(self, layer: int) -> str:
        return f"blk.{layer}.{self.gguf}.weight"


@dataclass(frozen=True)
class Norm:
    """An RMSNorm weight of a decoder layer."""

    module: str
    """Its Hugging Face name inside the layer (``input_layernorm``)."""
    gguf: str
    block: str
    """The block it normalises the input of (``self_attn`` or ``mlp``)."""

    def gguf_tensor(self, layer: int) -> str:
        return f"blk.{layer}.{self.gguf}.weight"


@dataclass(frozen=True)
class Architecture:
    """Everything the runtime needs to know about one family's tensors."""

    name: str
    gguf_architectures: tuple[str, ...]
    """Values of GGUF ``general.architecture`` read with this table."""
    projections: tuple[Projection, ...]
    norms: tuple[Norm, ...]
    embedding: str = "token_embd.weight"
    output: str = "output.weight"
    """The untied ``lm_head``; absent from the file when embeddings are tied."""
    output_norm: str = "output_norm.weight"
    rope_freqs: str = "rope_freqs.weight"
    """Llama 3 rope scaling factors, as llama.cpp stores them (optional)."""

    def projection(self, target: str) -> Projection:
        for p in self.projections:
            if p.target == target:
                return p
        raise KeyError(target)

    @property
    def targets(self) -> tuple[str, ...]:
        return tuple(p.target for p in self.projections)

    def layer_order(self) -> tuple[Norm | Projection, ...]:
        """A decoder layer's weights in file order: each block's norm, then its projections."""
        out: list[Norm | Projection] = []
        for norm in self.norms:
            out.append(norm)
            out += [p for p in self.projections if p.block == norm.block]
        return tuple(out)


LLAMA = Architecture(
    name="llama",
    gguf_architectures=("llama",),
    projections=(
        Projection(
            "q_proj",
            "self_attn",
            "attn_q",
            ("q_size", "hidden_size"),
            "the query projection of every layer",
            rope_heads="num_attention_heads",
        ),
        Projection(
            "k_proj",
            "self_attn",
            "attn_k",
            ("kv_size", "hidden_size"),
            "the key projection of every layer",
            rope_heads="num_key_value_heads",
        ),
        Projection(
            "v_proj",
            "self_attn",
            "attn_v",
            ("kv_size", "hidden_size"),
            "the value projection of every layer",
        ),
        Projection(
            "o_proj",
            "self_attn",
            "attn_output",
            ("hidden_size", "q_size"),
            "the attention output projection of every layer",
        ),
        Projection(
            "gate_proj",
            "mlp",
            "ffn_gate",
            ("intermediate_size", "hidden_size"),
            "the MLP gate projection of every layer",
        ),
        Projection(
            "up_proj",
            "mlp",
            "ffn_up",
            ("intermediate_size", "hidden_size"),
            "the MLP up projection of every layer",
        ),
        Projection(
            "down_proj",
            "mlp",
            "ffn_down",
            ("hidden_size", "intermediate_size"),
            "the MLP down projection of every layer",
        ),
    ),
    norms=(
        Norm("input_layernorm", "attn_norm", "self_attn"),
        Norm("post_attention_layernorm", "ffn_norm", "mlp"),
    ),
)

ARCHITECTURES: dict[str, Architecture] = {a.name: a for a in (LLAMA,)}


def for_gguf(general_architecture: str) -> Architecture | None:
    """The table for a GGUF file's ``general.architecture``; None when Aner does not know it."""
    for arch in ARCHITECTURES.values():
        if general_architecture in arch.gguf_architectures:
            return arch
    return None


def all_targets() -> tuple[Projection, ...]:
    """Every adapter target of every architecture, once each, in first-seen order (the members
    of the `Target` enum)."""
    seen: dict[str, Projection] = {}
    for arch in ARCHITECTURES.values():
        for p in arch.projections:
            seen.setdefault(p.target, p)
    return tuple(seen.values())

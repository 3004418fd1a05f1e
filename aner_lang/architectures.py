"""The one registry of model architectures: every fact about an architecture's tensors, as data.

A model file names its tensors in its own scheme (GGUF: ``blk.3.attn_q.weight``; Hugging Face:
``model.layers.3.self_attn.q_proj.weight``) and may store some of them permuted (llama.cpp's
converter interleaves the rotary halves of the q/k rows of Llama-family models). Loading,
adapters, merging, PEFT and GGUF export all need these facts; they read them here, so a new
architecture is one table, and the front end (the `Target` enum of the builtin registry) reads
the same table without torch.

Rules:

* Module names are Hugging Face's (``layers.{i}.self_attn.q_proj``), because adapters export to
  PEFT, which addresses modules by those names.
* A projection whose GGUF rows are permuted names the config field holding its head count
  (``num_attention_heads`` for q, ``num_key_value_heads`` for k); the permutation itself is
  `aner_lang.runtime.io.gguf.permute_rows` / `unpermute_rows`. llama.cpp permutes only the
  architectures whose GGUF rope is the interleaved-pair kind (Llama, Mistral); Qwen's "NEOX" rope
  is HF's own split-half layout, so its rows are stored as they are.
* The order of `projections` is the order adapters visit targets within a layer (attention,
  then MLP), which fixes the order their seeded initialisations are drawn in.
* `Architecture.weights(...)` lists every tensor of a model in one place (its name in our module,
  in a Hugging Face safetensors file and in a GGUF file, its shape as config fields, its
  permutation): the loader reads this list, the GGUF exporter writes it, fixtures generate it.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum


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
    """The block it normalises the input of (``self_attn`` or ``mlp``), or the output of."""
    after: bool = False
    """Whether it normalises the block's output before the residual add (Gemma's post-norms)."""

    def gguf_tensor(self, layer: int) -> str:
        return f"blk.{layer}.{self.gguf}.weight"


class Kind(Enum):
    """What a tensor of the model is, which decides how it is stored."""

    LINEAR = "linear"
    """A frozen weight matrix (`FrozenLinear`: a projection, the embedding, `lm_head`)."""
    NORM = "norm"
    """An RMSNorm weight (fp32 parameter of an `RMSNorm` module)."""
    BIAS = "bias"
    """A projection's bias (fp32 parameter of the attention module)."""


@dataclass(frozen=True)
class Weight:
    """One tensor of a model, under every name it has."""

    name: str
    """Where it lives in our module: a `FrozenLinear` or `RMSNorm` module (``layers.0.mlp.up_proj``,
    ``norm``) or, for a bias, the parameter itself (``layers.0.self_attn.q_bias``)."""
    hf: str
    """Its name in a Hugging Face safetensors file (``model.layers.0.self_attn.q_proj.bias``)."""
    gguf: str
    """Its name in a GGUF file (``blk.0.attn_q.bias``)."""
    shape: tuple[str, ...]
    """Config fields giving its shape, Hugging Face layout."""
    kind: Kind
    rope_heads: str | None = None
    """Config field with the head count its GGUF rows are permuted by (None: not permuted)."""


@dataclass(frozen=True)
class Architecture:
    """Everything the runtime needs to know about one family's tensors."""

    name: str
    gguf_architectures: tuple[str, ...]
    """Values of GGUF ``general.architecture`` read with this table (the first is written)."""
    hf_model_types: tuple[str, ...]
    """Values of a Hugging Face config.json's ``model_type`` read with this table."""
    projections: tuple[Projection, ...]
    norms: tuple[Norm, ...]
    biased: tuple[str, ...] = ()
    """Projections that carry a bias (Qwen2's q, k and v)."""
    qk_norm: bool = False
    """Whether queries and keys are RMS-normalised per head before rope (Qwen3, Gemma 3)."""
    activation: str = "silu"
    """The MLP gate's activation: ``silu`` (SwiGLU) or ``gelu_tanh`` (Gemma's GeGLU, HF's
    ``gelu_pytorch_tanh``)."""
    scaled_embedding: bool = False
    """Whether the embedding rows are multiplied by sqrt(hidden_size), rounded to the compute
    dtype (Gemma)."""
    sliding_pattern: int = 0
    """Every n-th layer attends globally, the others over a sliding window, as llama.cpp assumes
    for the architecture's GGUF files (Gemma 3: 6); 0: every layer global."""
    hf_norm_offset: float = 0.0
    """What Hugging Face files leave out of every RMSNorm weight: Gemma stores ``w`` and scales by
    ``1 + w``. GGUF files and Aner's modules hold the whole factor (llama.cpp's converter adds
    the 1), so reading a folder adds it and writing one subtracts it."""
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
            if not norm.after:
                out += [p for p in self.projections if p.block == norm.block]
        return tuple(out)

    def layer_weights(self, i: int) -> list[Weight]:
        """Every tensor of decoder layer `i`, in file order."""
        out: list[Weight] = []
        for part in self.layer_order():
            if isinstance(part, Norm):
                name = f"layers.{i}.{part.module}"
                out.append(
                    Weight(
                        name,
                        f"model.{name}.weight",
                        part.gguf_tensor(i),
                        ("hidden_size",),
                        Kind.NORM,
                    )
                )
                continue
            name = part.module(i)
            out.append(
                Weight(
                    name,
                    f"model.{name}.weight",
                    part.gguf_tensor(i),
                    part.shape,
                    Kind.LINEAR,
                    part.rope_heads,
                )
            )
            if part.target in self.biased:
                out.append(
                    Weight(
                        f"layers.{i}.{part.block}.{part.target.removesuffix('_proj')}_bias",
                        f"model.{name}.bias",
                        f"blk.{i}.{part.gguf}.bias",
                        part.shape[:1],
                        Kind.BIAS,
                        part.rope_heads,
                    )
                )
        if self.qk_norm:
            for letter in ("q", "k"):
                name = f"layers.{i}.self_attn.{letter}_norm"
                out.append(
                    Weight(
                        name,
                        f"model.{name}.weight",
                        f"blk.{i}.attn_{letter}_norm.weight",
                        ("head_dim",),
                        Kind.NORM,
                    )
                )
        return out

    def weights(self, layers: int, tied: bool) -> list[Weight]:
        """Every tensor of a model with `layers` decoder layers, in file order (the untied
        `lm_head` last; with tied embeddings `lm_head` is the embedding and has no tensor)."""
        out = [
            Weight(
                "embed_tokens",
                "model.embed_tokens.weight",
                self.embedding,
                ("vocab_size", "hidden_size"),
                Kind.LINEAR,
            )
        ]
        for i in range(layers):
            out += self.layer_weights(i)
        out.append(
            Weight("norm", "model.norm.weight", self.output_norm, ("hidden_size",), Kind.NORM)
        )
        if not tied:
            out.append(
                Weight(
                    "lm_head",
                    "lm_head.weight",
                    self.output,
                    ("vocab_size", "hidden_size"),
                    Kind.LINEAR,
                )
            )
        return out


def _projections(permuted: bool) -> tuple[Projection, ...]:
    """The seven projections of a Llama-family decoder layer; `permuted`: llama.cpp stores the q/k
    rows in interleaved-pair rope order."""
    return (
        Projection(
            "q_proj",
            "self_attn",
            "attn_q",
            ("q_size", "hidden_size"),
            "the query projection of every layer",
            rope_heads="num_attention_heads" if permuted else None,
        ),
        Projection(
            "k_proj",
            "self_attn",
            "attn_k",
            ("kv_size", "hidden_size"),
            "the key projection of every layer",
            rope_heads="num_key_value_heads" if permuted else None,
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
    )


_NORMS = (
    Norm("input_layernorm", "attn_norm", "self_attn"),
    Norm("post_attention_layernorm", "ffn_norm", "mlp"),
)

LLAMA = Architecture(
    name="llama",
    gguf_architectures=("llama",),
    hf_model_types=("llama", "mistral"),
    projections=_projections(permuted=True),
    norms=_NORMS,
)
"""Llama 1, 2, 3, 3.1, 3.2 and Mistral (llama.cpp converts Mistral as ``llama``)."""

QWEN2 = Architecture(
    name="qwen2",
    gguf_architectures=("qwen2",),
    hf_model_types=("qwen2",),
    projections=_projections(permuted=False),
    norms=_NORMS,
    biased=("q_proj", "k_proj", "v_proj"),
)
"""Qwen2 and Qwen2.5: biases on q, k and v."""

QWEN3 = Architecture(
    name="qwen3",
    gguf_architectures=("qwen3",),
    hf_model_types=("qwen3",),
    projections=_projections(permuted=False),
    norms=_NORMS,
    qk_norm=True,
)
"""Qwen3 (dense): per-head RMSNorm of queries and keys, no biases."""

GEMMA3 = Architecture(
    name="gemma3",
    gguf_architectures=("gemma3",),
    hf_model_types=("gemma3_text",),
    projections=_projections(permuted=False),
    norms=(
        Norm("input_layernorm", "attn_norm", "self_attn"),
        Norm("post_attention_layernorm", "post_attention_norm", "self_attn", after=True),
        Norm("pre_feedforward_layernorm", "ffn_norm", "mlp"),
        Norm("post_feedforward_layernorm", "post_ffw_norm", "mlp", after=True),
    ),
    qk_norm=True,
    activation="gelu_tanh",
    scaled_embedding=True,
    sliding_pattern=6,
    hf_norm_offset=1.0,
)
"""Gemma 3 (text): a norm before and after each block, q/k norms, GeGLU, a scaled embedding,
sliding-window layers with their own rope base (`ModelConfig.layer_types`). llama.cpp's rope for
Gemma is HF's split-half layout, so no rows are permuted."""

ARCHITECTURES: dict[str, Architecture] = {a.name: a for a in (LLAMA, QWEN2, QWEN3, GEMMA3)}


def for_gguf(general_architecture: str) -> Architecture | None:
    """The table for a GGUF file's ``general.architecture``; None when Aner does not know it."""
    for arch in ARCHITECTURES.values():
        if general_architecture in arch.gguf_architectures:
            return arch
    return None


def for_hf(model_type: str) -> Architecture | None:
    """The table for a Hugging Face config's ``model_type``; None when Aner does not know it."""
    for arch in ARCHITECTURES.values():
        if model_type in arch.hf_model_types:
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

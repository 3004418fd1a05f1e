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
* A checkpoint that stores projections fused (Phi-3's ``qkv_proj`` and ``gate_up_proj``) keeps
  them fused: one `FrozenLinear` per stored matrix, targeted under its own name. Splitting them
  would rename the modules PEFT addresses, so an adapter exported from Aner would not load onto
  transformers' model, and a LoRA on a fused matrix is not a sum of LoRAs on its parts.
* A mixture-of-experts architecture (`Architecture.experts`) replaces the MLP of its sparse layers
  by a router (``layers.{i}.mlp.gate``) and per-expert SwiGLU MLPs whose projections keep the
  dense MLP's target names (``layers.{i}.mlp.experts.{e}.gate_proj``): a ``gate_proj`` target
  adapts every expert's gate projection, each with its own matrices. Our module names are the
  same for every MoE family; the file names differ (Mixtral's ``block_sparse_moe.experts.{e}.w1``)
  and are `Experts`' facts. Which layers are sparse and how many experts they hold is the
  config's (`ModelConfig.experts_in`), passed to `weights` as ``experts_in``.
* `Architecture.weights(...)` lists every tensor of a model in one place (its name in our module,
  in a Hugging Face safetensors file and in a GGUF file, its shape as config fields, its
  permutation): the loader reads this list, the GGUF and Hugging Face exporters write it,
  fixtures generate it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from enum import Enum
from typing import Any


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
    expert: int | None = None
    """Which expert's matrix it is: GGUF stores a layer's experts' matrices of one projection
    as one 3-D tensor ``[num_experts, out, in]`` (HF order), and this weight is slice `expert`
    of it (None: the tensor is the whole weight)."""


@dataclass(frozen=True)
class Experts:
    """The file names of a mixture-of-experts layer's tensors (our module names are fixed:
    ``layers.{i}.mlp.gate`` for the router, ``layers.{i}.mlp.experts.{e}.{target}``)."""

    hf_block: str
    """The decoder layer's submodule holding router and experts in HF files (``block_sparse_moe``
    for Mixtral, ``mlp`` for Qwen3-MoE)."""
    hf_names: tuple[tuple[str, str], ...]
    """(target, HF name of that projection inside an expert): Mixtral's w1/w3/w2."""
    router_gguf: str = "ffn_gate_inp"
    """The router's GGUF stem; the experts' are the dense stems + ``_exps`` (one 3-D tensor)."""
    hf_count: str = "num_experts"
    """The config.json key of the expert count (Mixtral's ``num_local_experts``; transformers'
    config classes read either name, Aner writes the one the family's released configs use)."""
    hf_size: str = "moe_intermediate_size"
    """The config.json key of an expert's intermediate size (Mixtral's experts are the size of
    the dense ``intermediate_size``)."""
    hf_top_k: int = 8
    """transformers' `num_experts_per_tok` where a config.json leaves it out (Qwen3-MoE's 8,
    Mixtral's 2)."""
    hf_routing: bool = True
    """Whether config.json says which layers are sparse and whether the top-k routing weights
    are renormalised (Qwen3-MoE's ``mlp_only_layers``, ``decoder_sparse_step``,
    ``norm_topk_prob``); False: every layer is sparse and the weights always renormalised
    (Mixtral)."""

    def hf_name(self, target: str) -> str:
        return dict(self.hf_names)[target]


def expert_shape(shape: tuple[str, str]) -> tuple[str, str]:
    """An MLP projection's shape fields with the experts' own intermediate size."""
    own = {"intermediate_size": "moe_intermediate_size"}
    return own.get(shape[0], shape[0]), own.get(shape[1], shape[1])


def _dense(_layer: int) -> int:
    return 0


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
    sliding_rope: bool = False
    """Whether sliding layers rotate by a rope base of their own (Gemma 3); otherwise every layer
    uses the one base (Gemma 2)."""
    llamacpp_wide_scale_layers: int = 0
    """The layer count of the one size whose GGUF softmax scale llama.cpp takes from
    1/sqrt(hidden/heads) instead of 1/sqrt(head size) (the 27B: Gemma 2's 46, Gemma 3's 62)."""
    softcapping: tuple[float, float] | None = None
    """(attention, final) logit soft-caps a config that does not name them gets, as
    transformers and llama.cpp default them (Gemma 2: scores become cap * tanh(scores / cap));
    None: the family has no soft-capping."""
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
    rope_factors: tuple[str, str] = ("rope_factors_long.weight", "rope_factors_short.weight")
    """LongRoPE's long and short per-frequency factors, as llama.cpp stores them (optional)."""

    @property
    def fused(self) -> bool:
        """Whether q/k/v and gate/up are single stored matrices (``qkv_proj``,
        ``gate_up_proj``), split by the decoder after projecting."""
        return "qkv_proj" in self.targets

    experts: Experts | None = None
    """A mixture-of-experts family's expert tensor names (None: every MLP is dense)."""

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

    def layer_weights(self, i: int, experts: int = 0) -> list[Weight]:
        """Every tensor of decoder layer `i`, in file order; `experts` > 0: its MLP is that many
        experts behind a router (`Experts`)."""
        out: list[Weight] = []
        for part in self.layer_order():
            if isinstance(part, Projection) and part.block == "mlp" and experts:
                if part.target == self.projections[-1].target:
                    out += self._expert_weights(i, experts)
                continue
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

    def _expert_weights(self, i: int, experts: int) -> list[Weight]:
        """The router and every expert's MLP projections of sparse layer `i`."""
        if self.experts is None:
            raise ValueError(f"{self.name} models have no experts")
        hf = f"model.layers.{i}.{self.experts.hf_block}"
        out = [
            Weight(
                f"layers.{i}.mlp.gate",
                f"{hf}.gate.weight",
                f"blk.{i}.{self.experts.router_gguf}.weight",
                ("num_experts", "hidden_size"),
                Kind.LINEAR,
            )
        ]
        for p in self.projections:
            if p.block == "mlp":  # one projection's experts together, as its GGUF tensor is
                out += [
                    Weight(
                        f"layers.{i}.mlp.experts.{e}.{p.target}",
                        f"{hf}.experts.{e}.{self.experts.hf_name(p.target)}.weight",
                        f"blk.{i}.{p.gguf}_exps.weight",
                        expert_shape(p.shape),
                        Kind.LINEAR,
                        expert=e,
                    )
                    for e in range(experts)
                ]
        return out

    def target_modules(self, target: str, layer: int, experts: int) -> list[str]:
        """Our module names adapted by `target` in `layer` (one per expert where the target is
        an MLP projection of a layer of `experts` > 0 experts)."""
        p = self.projection(target)
        if p.block == "mlp" and experts:
            return [f"layers.{layer}.mlp.experts.{e}.{target}" for e in range(experts)]
        return [p.module(layer)]

    def weights(
        self, layers: int, tied: bool, experts_in: Callable[[int], int] = _dense
    ) -> list[Weight]:
        """Every tensor of a model with `layers` decoder layers, in file order (the untied
        `lm_head` last; with tied embeddings `lm_head` is the embedding and has no tensor);
        `experts_in(i)`: the expert count of layer `i` (0: a dense MLP)."""
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
            out += self.layer_weights(i, experts_in(i))
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


def _fused_projections() -> tuple[Projection, ...]:
    """Phi-3's four projections: q, k and v stored as one matrix (rows q, then k, then v), gate
    and up as one (rows gate, then up); llama.cpp keeps both fused, rows unpermuted."""
    o_proj, down_proj = (
        p for p in _projections(permuted=False) if p.target in ("o_proj", "down_proj")
    )
    return (
        Projection(
            "qkv_proj",
            "self_attn",
            "attn_qkv",
            ("qkv_size", "hidden_size"),
            "the fused query, key and value projection of every layer (Phi-3, Phi-4)",
        ),
        o_proj,
        Projection(
            "gate_up_proj",
            "mlp",
            "ffn_up",
            ("gate_up_size", "hidden_size"),
            "the fused MLP gate and up projection of every layer (Phi-3, Phi-4)",
        ),
        down_proj,
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

PHI3 = Architecture(
    name="phi3",
    gguf_architectures=("phi3",),
    hf_model_types=("phi3",),
    projections=_fused_projections(),
    norms=_NORMS,
)
"""Phi-3, Phi-3.5 and Phi-4 (mini and 14B): fused qkv and gate/up matrices; LongRoPE and partial
rotary dimensions where their configs have them."""


def _moe(
    name: str,
    gguf_architecture: str,
    hf_block: str,
    hf_names: tuple[str, str, str],
    *,
    permuted: bool,
    qk_norm: bool = False,
    config: dict[str, Any] | None = None,
) -> Architecture:
    """A mixture-of-experts family: Llama-family attention (`permuted` and `qk_norm` as the dense
    tables say), and experts whose gate, up and down projections are `hf_names` inside
    `hf_block` of a Hugging Face file (`config`: the family's config.json fields of `Experts`)."""
    names = tuple(zip(("gate_proj", "up_proj", "down_proj"), hf_names))
    return Architecture(
        name=name,
        gguf_architectures=(gguf_architecture,),
        hf_model_types=(name,),
        projections=_projections(permuted=permuted),
        norms=_NORMS,
        qk_norm=qk_norm,
        experts=Experts(hf_block, names, **(config or {})),
    )


MIXTRAL = _moe(
    "mixtral",
    "llama",
    "block_sparse_moe",
    ("w1", "w3", "w2"),
    permuted=True,
    config={
        "hf_count": "num_local_experts",
        "hf_size": "intermediate_size",
        "hf_top_k": 2,
        "hf_routing": False,
    },
)
"""Mixtral: every MLP is top-k of `num_local_experts` experts, the k weights renormalised.
llama.cpp converts it as ``llama`` with expert tensors (``llama.expert_count`` > 0)."""

QWEN3_MOE = _moe(
    "qwen3_moe",
    "qwen3moe",
    "mlp",
    ("gate_proj", "up_proj", "down_proj"),
    permuted=False,
    qk_norm=True,
)
"""Qwen3-MoE: Qwen3's attention; the MLPs of the layers `decoder_sparse_step` picks (and
`mlp_only_layers` leaves out) are top-k of `num_experts` experts, renormalised when
`norm_topk_prob`."""

_GEMMA_NORMS = (
    Norm("input_layernorm", "attn_norm", "self_attn"),
    Norm("post_attention_layernorm", "post_attention_norm", "self_attn", after=True),
    Norm("pre_feedforward_layernorm", "ffn_norm", "mlp"),
    Norm("post_feedforward_layernorm", "post_ffw_norm", "mlp", after=True),
)
"""Gemma's sandwich: a norm before and after each block."""

GEMMA3 = Architecture(
    name="gemma3",
    gguf_architectures=("gemma3",),
    hf_model_types=("gemma3_text",),
    projections=_projections(permuted=False),
    norms=_GEMMA_NORMS,
    qk_norm=True,
    activation="gelu_tanh",
    scaled_embedding=True,
    sliding_pattern=6,
    sliding_rope=True,
    llamacpp_wide_scale_layers=62,
    hf_norm_offset=1.0,
)
"""Gemma 3 (text): a norm before and after each block, q/k norms, GeGLU, a scaled embedding,
sliding-window layers with their own rope base (`ModelConfig.layer_types`). llama.cpp's rope for
Gemma is HF's split-half layout, so no rows are permuted."""

GEMMA2 = Architecture(
    name="gemma2",
    gguf_architectures=("gemma2",),
    hf_model_types=("gemma2",),
    projections=_projections(permuted=False),
    norms=_GEMMA_NORMS,
    activation="gelu_tanh",
    scaled_embedding=True,
    sliding_pattern=2,
    llamacpp_wide_scale_layers=46,
    softcapping=(50.0, 30.0),
    hf_norm_offset=1.0,
)
"""Gemma 2: Gemma 3's sandwich norms, GeGLU and scaled embedding, without q/k norms; sliding and
global layers alternate (layer 0 sliding) under one rope base; attention scores and the final
logits are soft-capped."""

ARCHITECTURES: dict[str, Architecture] = {
    a.name: a for a in (LLAMA, QWEN2, QWEN3, PHI3, MIXTRAL, QWEN3_MOE, GEMMA3, GEMMA2)
}


def for_gguf(general_architecture: str, experts: bool = False) -> Architecture | None:
    """The table for a GGUF file's ``general.architecture``; None when Aner does not know it.
    `experts`: the file declares experts (``{arch}.expert_count`` > 0), which tells Mixtral
    from Llama (both ``llama``)."""
    known = [a for a in ARCHITECTURES.values() if general_architecture in a.gguf_architectures]
    for arch in known:
        if (arch.experts is not None) == experts:
            return arch
    return known[0] if known else None


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

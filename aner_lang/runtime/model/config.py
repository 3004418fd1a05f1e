"""Model hyper-parameters, named as in Hugging Face configs, read from a GGUF's metadata or a
folder's config.json and checked before any tensor is read.

Both file kinds give the one `ModelConfig`; what differs between architectures (biases, q/k
norms, GGUF permutations) is a fact of its table in `aner_lang.architectures`, named by
`ModelConfig.architecture`, not a field here. The checks make a bad file fail with its path and
the offending value before any large allocation: sizes and counts that are positive integers in
the file itself (`_Fields`), a head count the key/value head count divides, an even head size
(rope rotates pairs), finite positive epsilon and rope parameters, a rope scaling Aner
implements.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeGuard

from aner_lang.architectures import ARCHITECTURES, Architecture, Experts, for_gguf, for_hf
from aner_lang.grammar.limits import INT_MAX
from aner_lang.problems.errors import AnerRuntimeError

if TYPE_CHECKING:
    import torch

    from aner_lang.runtime.io.gguf import GGUFFile

ROPE_SCALINGS = ("llama3", "linear", "longrope")
SLIDING, FULL = "sliding_attention", "full_attention"
LOCAL_THETA = 10000.0
"""The rope base of sliding layers that llama.cpp assumes when a GGUF does not say (Gemma 3's)."""


def every_nth_full(layers: int, n: int) -> tuple[str, ...]:
    """Layer types with every `n`-th layer full attention and the others sliding (HF's
    ``sliding_window_pattern``)."""
    return tuple(SLIDING if (i + 1) % n else FULL for i in range(layers))


@dataclass(frozen=True)
class RopeScaling:
    """Rope frequency scaling (HF ``rope_scaling``/``rope_parameters``): ``llama3`` (Llama 3.1 and
    later: low frequencies slowed by `factor`, a smooth ramp between), ``linear``, or
    ``longrope`` (Phi-3 128k, Phi-3.5, Phi-4-mini: every frequency divided by its own factor,
    `short_factor` while a sequence fits `original_max_position_embeddings` and `long_factor`
    beyond, and cos/sin multiplied by `attention_factor`)."""

    rope_type: str
    factor: float
    low_freq_factor: float = 1.0
    high_freq_factor: float = 4.0
    original_max_position_embeddings: int = 8192
    short_factor: tuple[float, ...] = ()
    long_factor: tuple[float, ...] = ()
    attention_factor: float = 1.0


def longrope_attention_factor(factor: float, original: int) -> float:
    """LongRoPE's default cos/sin scale for a context `factor` times the pretraining one
    (`original` positions), as transformers' `_compute_longrope_parameters` and llama.cpp's
    converter compute it: ``sqrt(1 + ln(factor) / ln(original))``, 1 when not extended."""
    return math.sqrt(1 + math.log(factor) / math.log(original)) if factor > 1.0 else 1.0


@dataclass(frozen=True)
class ModelConfig:
    """Model hyper-parameters, named as in HF `LlamaConfig`/`Qwen2Config`/`Qwen3Config`."""

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
    rope_scaling: RopeScaling | None = None
    """Scales the rope of full-attention layers only (Gemma 3 scales its global layers)."""
    query_pre_attn_scalar: float | None = None
    """Attention scores are divided by its square root (None: by the head size's)."""
    sliding_window: int | None = None
    """How many positions (the query's own included) a sliding-attention layer sees."""
    layer_types: tuple[str, ...] = ()
    """Per layer, ``sliding_attention`` or ``full_attention`` (empty: every layer full), HF's
    names; sliding layers see `sliding_window` positions and use `rope_local_theta`."""
    rope_local_theta: float | None = None
    """The rope base of sliding layers, unscaled (None: `rope_theta`)."""
    attn_logit_softcapping: float | None = None
    """Attention scores (after the softmax scale) become cap * tanh(score / cap) (None: as they
    are); Gemma 2."""
    final_logit_softcapping: float | None = None
    """The output logits become cap * tanh(logit / cap) (None: as they are); Gemma 2."""

    def sliding(self, layer: int) -> bool:
        """Whether `layer` attends over a sliding window."""
        return bool(self.layer_types) and self.layer_types[layer] == SLIDING

    partial_rotary_factor: float = 1.0
    """The fraction of each head's dimensions rope rotates (the first `rotary_dim`; Phi-4-mini:
    0.75); the rest pass through unrotated."""

    @property
    def rotary_dim(self) -> int:
        """Dimensions of a head that rope rotates, as transformers computes them."""
        return int(self.head_dim * self.partial_rotary_factor)

    @property
    def qkv_size(self) -> int:
        """Rows of a fused q/k/v matrix (`aner_lang.architectures.PHI3`)."""
        return self.q_size + 2 * self.kv_size

    @property
    def gate_up_size(self) -> int:
        """Rows of a fused gate/up matrix."""
        return 2 * self.intermediate_size

    num_experts: int = 0
    """Experts of each sparse MLP (0: a dense model); HF Mixtral's ``num_local_experts``."""
    num_experts_per_tok: int = 0
    """How many experts each token is routed to (top-k)."""
    moe_intermediate_size: int = 0
    """An expert's intermediate size (Mixtral's experts have the dense `intermediate_size`)."""
    norm_topk_prob: bool = True
    """Whether the k routing weights are renormalised to sum to 1 (always, for Mixtral)."""
    mlp_only_layers: tuple[int, ...] = ()
    """Layers of a mixture-of-experts model whose MLP is dense (Qwen3-MoE)."""
    decoder_sparse_step: int = 1
    """Layer i is sparse when (i + 1) is a multiple of this (Qwen3-MoE; 1: every layer)."""
    router_aux_loss_coef: float = 0.0
    """The weight of the load-balancing loss added to the training loss (0: none; HF adds it
    only when ``output_router_logits`` is true, and so does Aner)."""

    @property
    def q_size(self) -> int:
        return self.num_attention_heads * self.head_dim

    @property
    def kv_size(self) -> int:
        return self.num_key_value_heads * self.head_dim

    def experts_in(self, layer: int) -> int:
        """How many experts layer `layer`'s MLP holds (0: a dense MLP)."""
        sparse = layer not in self.mlp_only_layers and (layer + 1) % self.decoder_sparse_step == 0
        return self.num_experts if sparse else 0

    def dims(self, fields: tuple[str, ...]) -> tuple[int, ...]:
        """A weight's shape (HF layout) from the config fields an architecture table names."""
        return tuple(int(getattr(self, f)) for f in fields)


def rope_wavelengths(config: ModelConfig) -> list[float]:
    """The wavelength, in positions, of each of the `head_dim // 2` rope frequencies
    (``2 pi / theta ** (-2i / head_dim)``): what Llama 3's scaling rules are stated in."""
    return [
        2 * math.pi / config.rope_theta ** (-2.0 * i / config.head_dim)
        for i in range(config.head_dim // 2)
    ]


def rope_freq_factors(config: ModelConfig) -> torch.Tensor | None:
    """Per-frequency divisors of the rope inverse frequencies (`head_dim // 2` values), or None.

    ``llama3``: computed as llama.cpp's converter writes them to ``rope_freqs.weight`` (HF's
    `rope_type="llama3"`): 1 for wavelengths shorter than `original / high_freq_factor`, `factor`
    for those longer than `original / low_freq_factor`, a smooth ramp between. ``linear``:
    `factor` everywhere (positions divided by the factor). torch is imported here, not with the
    module: `aner plan` reads configs without it."""
    import torch

    s = config.rope_scaling
    if s is None or s.rope_type == "longrope":  # LongRoPE's factors live in the config
        return None
    if s.rope_type == "linear":
        return torch.full((config.head_dim // 2,), float(s.factor))
    low_wavelen = s.original_max_position_embeddings / s.low_freq_factor
    high_wavelen = s.original_max_position_embeddings / s.high_freq_factor
    factors = []
    for wavelen in rope_wavelengths(config):
        if wavelen < high_wavelen:
            factors.append(1.0)
        elif wavelen > low_wavelen:
            factors.append(s.factor)
        else:
            smooth = (s.original_max_position_embeddings / wavelen - s.low_freq_factor) / (
                s.high_freq_factor - s.low_freq_factor
            )
            factors.append(1 / ((1 - smooth) / s.factor + smooth))
    return torch.tensor(factors, dtype=torch.float32)


def scaling_of_factors(config: ModelConfig, factors: torch.Tensor) -> RopeScaling | None:
    """The ``linear`` or ``llama3`` rope scaling whose `rope_freq_factors` are `factors` (a GGUF's
    ``rope_freqs``, which llama.cpp's converter writes in place of the parameters), or None when
    neither reproduces them to float32 precision.

    Rules: equal factors are ``linear``. For ``llama3``, `factor` is the largest factor; a factor
    f strictly between 1 and it lies on the ramp, where smooth = (1/f - 1/factor) / (1 -
    1/factor) = (original / wavelength - low) / (high - low) is linear in 1 / wavelength: two
    ramp points give its slope a = original / (high - low) and intercept b = -low / (high - low),
    which is all the factors say (the three parameters scaled alike give the same factors), so
    `low_freq_factor` is taken as 1, as in every Llama 3.1 and later: high = 1 - 1/b and original
    = -a/b. Fewer than two ramp points leave the parameters open: None."""
    import torch

    f = [float(x) for x in factors.double()]
    candidates: list[RopeScaling] = []
    if all(math.isclose(x, f[0], rel_tol=1e-6) for x in f) and f[0] > 0:
        candidates.append(RopeScaling("linear", f[0]))
    factor = max(f)
    ramp = [
        (w, x)
        for w, x in zip(rope_wavelengths(config), f, strict=True)
        if 1 + 1e-6 < x < factor * (1 - 1e-6)
    ]
    if factor > 1 and len(ramp) >= 2:
        (w0, f0), (w1, f1) = ramp[0], ramp[-1]

        def smooth(x: float) -> float:
            return (1 / x - 1 / factor) / (1 - 1 / factor)

        a = (smooth(f1) - smooth(f0)) / (1 / w1 - 1 / w0)
        b = smooth(f0) - a / w0
        if b < 0:
            original, high = round(-a / b), 1 - 1 / b
            candidates += [  # the round figure a config would say first, then the exact one
                RopeScaling("llama3", factor, 1.0, round(high, 4), original),
                RopeScaling("llama3", factor, 1.0, high, original),
            ]
    want = torch.tensor(f, dtype=torch.float32)
    for scaling in candidates:
        got = rope_freq_factors(replace(config, rope_scaling=scaling))
        if got is not None and torch.allclose(got, want, rtol=1e-6, atol=0.0):
            return scaling
    return None


@dataclass(frozen=True)
class _Fields:
    """A file's hyper-parameters (GGUF metadata under `prefix`, or config.json's keys), each read
    with the type its meaning needs, from the file's own types:

    * A size or a count is an exact integer (a GGUF integer type, a JSON integer) from 1 to the
      largest `Int` (`model_info` shows it to scripts). Anything else (1.5, or 2.0, for a layer
      count; a string; an array; a boolean; a negative count) is refused, never rounded.
    * A real number may be written as an integer or a float, and must be finite.

    An error names the file and the key (`code`: E-GGUF-METADATA or E-HF-CONFIG)."""

    source: str
    code: str
    values: Mapping[str, Any]
    prefix: str = ""

    def _value(self, key: str, default: Any) -> tuple[str, Any]:
        name = self.prefix + key
        if name in self.values and self.values[name] is not None:
            return name, self.values[name]
        if default is None:
            raise AnerRuntimeError(f"{self.source}: missing key {name!r}", code=self.code)
        return name, default

    def integer(self, key: str, default: int | None = None) -> int:
        name, value = self._value(key, default)
        if type(value) is not int or not 1 <= value <= INT_MAX:
            raise AnerRuntimeError(
                f"{self.source}: {name} is {value!r}, not a positive integer",
                code=self.code,
                notes=(f"a size or a count is a whole number from 1 to {INT_MAX:,}",),
            )
        return value

    def real(self, key: str, default: float | None = None) -> float:
        name, value = self._value(key, default)
        if type(value) not in (int, float) or not math.isfinite(value):
            raise AnerRuntimeError(
                f"{self.source}: {name} is {value!r}, not a finite number", code=self.code
            )
        return float(value)


def _check(source: str, code: str, c: ModelConfig) -> ModelConfig:
    def bad(what: str) -> AnerRuntimeError:
        return AnerRuntimeError(f"{source}: {what}", code=code)

    if c.num_attention_heads % c.num_key_value_heads:
        raise bad(
            f"inconsistent attention shape: {c.num_attention_heads} heads, "
            f"{c.num_key_value_heads} KV heads (the KV head count must divide the head count)"
        )
    if c.head_dim % 2:
        raise bad(f"head size {c.head_dim} is odd; rope rotates pairs of dimensions")
    if not 0 < c.rotary_dim <= c.head_dim or c.rotary_dim % 2:
        raise bad(
            f"rope covers {c.rotary_dim} of the {c.head_dim} dimensions of a head; it must be "
            "an even number of them, at least 2"
        )
    for field in ("rms_norm_eps", "rope_theta"):
        v = float(getattr(c, field))
        if not math.isfinite(v) or v <= 0:
            raise bad(f"{field} is {v}; it must be a finite positive number")
    if c.layer_types and (
        len(c.layer_types) != c.num_hidden_layers or not set(c.layer_types) <= {SLIDING, FULL}
    ):
        raise bad(
            f"layer_types {list(c.layer_types)} must name {c.num_hidden_layers} layers, each "
            f"{SLIDING!r} or {FULL!r}"
        )
    if SLIDING in c.layer_types and (c.sliding_window is None or c.sliding_window <= 0):
        raise bad(f"sliding_window is {c.sliding_window}; sliding layers need a positive window")
    for field in (
        "query_pre_attn_scalar",
        "rope_local_theta",
        "attn_logit_softcapping",
        "final_logit_softcapping",
    ):
        v = getattr(c, field)
        if v is not None and (not math.isfinite(float(v)) or float(v) <= 0):
            raise bad(f"{field} is {v}; it must be a finite positive number")
    if c.num_experts and not 1 <= c.num_experts_per_tok <= c.num_experts:
        raise bad(
            f"{c.num_experts_per_tok} experts per token of {c.num_experts}: a token is routed "
            "to from 1 to all of the experts"
        )
    if not (math.isfinite(c.router_aux_loss_coef) and c.router_aux_loss_coef >= 0):
        raise bad(f"router_aux_loss_coef is {c.router_aux_loss_coef}; it must be finite and >= 0")
    s = c.rope_scaling
    if s is not None:
        values = (s.factor, s.low_freq_factor, s.high_freq_factor)
        if not all(math.isfinite(v) and v > 0 for v in values):
            raise bad(f"rope scaling {s} has a factor that is not a finite positive number")
        if s.rope_type == "llama3" and (
            s.high_freq_factor <= s.low_freq_factor or s.original_max_position_embeddings <= 0
        ):
            raise bad(f"llama3 rope scaling {s} needs high_freq_factor > low_freq_factor")
        if s.rope_type == "longrope":
            _check_longrope(bad, s, c.rotary_dim)
    return c


def _check_longrope(bad: Any, s: RopeScaling, rotary_dim: int) -> None:
    """One finite positive factor per rotated frequency pair, in both lists."""
    for name in ("short_factor", "long_factor"):
        values = getattr(s, name)
        if len(values) != rotary_dim // 2:
            raise bad(
                f"longrope {name} has {len(values)} values; the {rotary_dim} rotated dimensions "
                f"of a head need {rotary_dim // 2}"
            )
        if not all(math.isfinite(v) and v > 0 for v in values):
            raise bad(f"longrope {name} holds a value that is not a finite positive number")
    if s.original_max_position_embeddings <= 0 or not (
        math.isfinite(s.attention_factor) and s.attention_factor > 0
    ):
        raise bad("longrope scaling needs a positive original context and attention factor")


def _unknown_architecture(source: str, code: str, what: str, known: list[str]) -> AnerRuntimeError:
    return AnerRuntimeError(
        f"{source}: unsupported model architecture {what!r}: Aner loads {', '.join(known)}",
        code=code,
        notes=("docs/models.md lists the supported architectures and how to add one",),
    )


def config_from_gguf(gguf: GGUFFile) -> ModelConfig:
    """The model's hyper-parameters (HF config names), checked; raises for an architecture
    without a table in `aner_lang.architectures`."""
    arch = gguf.architecture
    meta = gguf.metadata
    experts = meta.get(_expert_key("EXPERT_COUNT", arch))
    table = for_gguf(arch, experts=bool(experts))
    if table is not None and table.experts is None and experts:
        raise AnerRuntimeError(
            f"{gguf.path}: a {arch} GGUF with {experts!r} experts; Aner reads "
            "mixture-of-experts GGUF files of Mixtral (llama) and Qwen3-MoE (qwen3moe) only",
            code="E-GGUF-ARCH",
            notes=("docs/models.md lists the supported architectures and file kinds",),
        )
    if table is None:
        known = list(dict.fromkeys(a for t in ARCHITECTURES.values() for a in t.gguf_architectures))
        raise _unknown_architecture(
            str(gguf.path), "E-GGUF-ARCH", arch, [f"{k} GGUF files" for k in known]
        )
    f = _Fields(str(gguf.path), "E-GGUF-METADATA", meta, f"{arch}.")
    hidden = f.integer("embedding_length")
    heads = f.integer("attention.head_count")
    tokens = meta.get("tokenizer.ggml.tokens")
    vocab = f.integer("vocab_size", len(tokens) if isinstance(tokens, list) else None)
    head_dim = f.integer("attention.key_length", max(hidden // heads, 1))
    rotary = f.integer("rope.dimension_count", head_dim)
    context = f.integer("context_length", 2048)
    window = (
        f.integer("attention.sliding_window") if meta.get(f"{arch}.attention.sliding_window") else 0
    )
    scaling = None
    kind = str(meta.get(f"{arch}.rope.scaling.type", "none"))
    if gguf.has_tensor(table.rope_factors[0]):  # llama.cpp writes LongRoPE as factor tensors
        scaling = _gguf_longrope(gguf, table.rope_factors, rotary, context)
    elif kind == "linear":
        scaling = RopeScaling("linear", f.real("rope.scaling.factor"))
    elif kind != "none":
        raise AnerRuntimeError(
            f"{gguf.path}: rope scaling {kind!r} is not implemented "
            f"(Aner implements {', '.join(ROPE_SCALINGS)})",
            code="E-GGUF-METADATA",
        )
    config = ModelConfig(
        **_gguf_sliding(gguf, table, f),
        **_gguf_softcapping(gguf, table, f),
        vocab_size=vocab,
        hidden_size=hidden,
        intermediate_size=f.integer("feed_forward_length"),
        num_hidden_layers=f.integer("block_count"),
        num_attention_heads=heads,
        num_key_value_heads=f.integer("attention.head_count_kv", heads),
        head_dim=head_dim,
        rms_norm_eps=f.real("attention.layer_norm_rms_epsilon", 1e-5),
        rope_theta=f.real("rope.freq_base", 10000.0),
        max_position_embeddings=(
            min(context, window) if window > 0 and not table.sliding_pattern else context
        ),
        tie_word_embeddings=not gguf.has_tensor(table.output),
        architecture=table.name,
        rope_scaling=scaling,
        partial_rotary_factor=rotary / head_dim if head_dim > 0 else 1.0,
        **_gguf_experts(gguf, table, f),
    )
    return _check(str(gguf.path), "E-GGUF-METADATA", config)


def _expert_key(name: str, arch: str) -> str:
    """The GGUF metadata key `gguf.Keys.LLM.<name>` of architecture `arch`."""
    import gguf

    return str(getattr(gguf.Keys.LLM, name)).format(arch=arch)


def _gguf_experts(gguf: GGUFFile, table: Architecture, f: _Fields) -> dict[str, Any]:
    """The mixture-of-experts fields of a GGUF as llama.cpp reads them: ``expert_count`` and
    ``expert_used_count``, the experts' intermediate size (``expert_feed_forward_length``, else
    the dense ``feed_forward_length``, as Mixtral's files have it), every layer sparse and the
    top-k weights renormalised (llama.cpp's Llama and Qwen3-MoE graphs do both); none for a
    dense table."""
    arch = gguf.architecture

    def key(name: str) -> str:
        return _expert_key(name, arch).removeprefix(f.prefix)

    if table.experts is None:
        return {}
    return {
        "num_experts": f.integer(key("EXPERT_COUNT")),
        "num_experts_per_tok": f.integer(key("EXPERT_USED_COUNT")),
        "moe_intermediate_size": f.integer(
            key("EXPERT_FEED_FORWARD_LENGTH"), f.integer("feed_forward_length")
        ),
        "norm_topk_prob": True,
    }


def _gguf_sliding(gguf: GGUFFile, table: Architecture, f: _Fields) -> dict[str, Any]:
    """The sliding-window fields of a GGUF as llama.cpp reads them: the window from
    ``attention.sliding_window``, the layer pattern the architecture implies (or
    ``attention.sliding_window_pattern``), the sliding layers' rope base (``rope.freq_base_swa``,
    else 10000), and llama.cpp's softmax scale (1/sqrt(head size); 1/sqrt(hidden/heads) for
    Gemma 3 27B, the 62-layer one)."""
    if not table.sliding_pattern:
        return {}
    p = f"{gguf.architecture}."
    layers, hidden = f.integer("block_count"), f.integer("embedding_length")
    heads = f.integer("attention.head_count")
    pattern = gguf.metadata.get(p + "attention.sliding_window_pattern", table.sliding_pattern)
    if isinstance(pattern, list) and len(pattern) == layers:
        types = tuple(SLIDING if bool(x) else FULL for x in pattern)
    elif isinstance(pattern, int) and not isinstance(pattern, bool) and pattern > 0:
        types = every_nth_full(layers, pattern)
    else:
        raise AnerRuntimeError(
            f"{gguf.path}: metadata key {p}attention.sliding_window_pattern is {pattern!r}, "
            f"not a positive count or {layers} flags",
            code="E-GGUF-METADATA",
        )
    head_dim = f.integer("attention.key_length", max(hidden // heads, 1))
    return {
        "sliding_window": f.integer("attention.sliding_window"),
        "layer_types": types,
        "rope_local_theta": (
            f.real("rope.freq_base_swa", LOCAL_THETA) if table.sliding_rope else None
        ),
        "query_pre_attn_scalar": _llamacpp_scalar(table, layers, hidden, heads, head_dim),
    }


def _llamacpp_scalar(table: Architecture, layers: int, hidden: int, heads: int, head: int) -> float:
    """The `query_pre_attn_scalar` llama.cpp uses for a GGUF of a sliding-window family: the head
    size, or hidden/heads for the size `Architecture.llamacpp_wide_scale_layers` names."""
    return float(hidden // heads if layers == table.llamacpp_wide_scale_layers else head)


def _softcap_keys(table: Architecture) -> tuple[str, str]:
    """The GGUF metadata keys of the attention and final logit soft-caps (gguf's own names)."""
    from gguf import Keys

    arch = table.gguf_architectures[0]
    return (
        Keys.LLM.ATTN_LOGIT_SOFTCAPPING.format(arch=arch),
        Keys.LLM.FINAL_LOGIT_SOFTCAPPING.format(arch=arch),
    )


def _gguf_softcapping(gguf: GGUFFile, table: Architecture, f: _Fields) -> dict[str, Any]:
    """The soft-caps of a family that has them, as llama.cpp reads them: each key, else the
    family's default (`Architecture.softcapping`)."""
    if table.softcapping is None:
        return {}
    fields = ("attn_logit_softcapping", "final_logit_softcapping")
    p = f"{gguf.architecture}."
    return {
        field: f.real(key.removeprefix(p), default)
        for field, key, default in zip(fields, _softcap_keys(table), table.softcapping)
    }


def _gguf_longrope(
    gguf: GGUFFile, tensors: tuple[str, str], rotary: int, context: int
) -> RopeScaling:
    """LongRoPE as llama.cpp's converter stores it: the long and short factors as f32 tensors of
    `rotary / 2` values, the pretraining context and the cos/sin scale as metadata (the scale
    defaults to `longrope_attention_factor`, as the converter computes it)."""
    p = f"{gguf.architecture}.rope.scaling."
    original = gguf.metadata.get(p + "original_context_length", context)
    scale = gguf.metadata.get(p + "attn_factor")
    if not _positive_int(original):
        raise AnerRuntimeError(
            f"{gguf.path}: metadata key {p}original_context_length is {original!r}, "
            "not a positive integer",
            code="E-GGUF-METADATA",
        )
    if scale is None:
        scale = longrope_attention_factor(context / original, original)
    long, short = (
        tuple(float(v) for v in gguf.tensor(name, (max(rotary, 0) // 2,)).tolist())
        for name in tensors
    )
    return RopeScaling(
        "longrope",
        context / original,
        original_max_position_embeddings=original,
        short_factor=short,
        long_factor=long,
        attention_factor=float(scale),
    )


def _hf_rope(
    source: str, cfg: dict[str, Any], local: bool = False
) -> tuple[float, RopeScaling | None, float | None]:
    """(rope_theta, scaling, sliding layers' rope_theta) from config.json: transformers 5's
    ``rope_parameters`` (per layer type for Gemma 3: ``full_attention``/``sliding_attention``)
    or the older ``rope_theta`` + ``rope_scaling`` (+ Gemma 3's ``rope_local_base_freq``).
    `local`: the model has sliding layers, whose rope is never scaled."""
    params = cfg.get("rope_parameters") or cfg.get("rope_scaling") or {}
    if not isinstance(params, dict):
        raise AnerRuntimeError(
            f"{source}: rope parameters {params!r} are not an object", code="E-HF-CONFIG"
        )
    where = "rope_parameters." if cfg.get("rope_parameters") else "rope_scaling."
    top = _Fields(source, "E-HF-CONFIG", cfg)
    local_theta = None
    if local:
        by_type = params if FULL in params else {}
        sliding = by_type.get(SLIDING) or {}
        full = by_type.get(FULL) or params
        if not isinstance(sliding, dict) or not isinstance(full, dict):
            raise AnerRuntimeError(
                f"{source}: rope parameters {params!r} are not objects per layer type",
                code="E-HF-CONFIG",
            )
        own = _Fields(source, "E-HF-CONFIG", sliding, f"{where}{SLIDING}.")
        local_theta = own.real("rope_theta", top.real("rope_local_base_freq", LOCAL_THETA))
        if sliding.get("rope_type", "default") != "default":
            raise AnerRuntimeError(
                f"{source}: rope scaling of sliding layers is not implemented", code="E-HF-CONFIG"
            )
        if FULL in by_type:
            where += f"{FULL}."
        params = full
    f = _Fields(source, "E-HF-CONFIG", {where + k: v for k, v in params.items()}, where)
    theta = f.real("rope_theta", top.real("rope_theta", 10000.0))
    kind = params.get("rope_type", params.get("type", "default"))
    kind = "longrope" if kind == "su" else kind  # Phi-3's first configs' name for it
    if kind == "default":
        return theta, None, local_theta
    if kind == "longrope":
        return theta, _hf_longrope(source, cfg, params), local_theta
    if kind not in ROPE_SCALINGS:
        raise AnerRuntimeError(
            f"{source}: rope scaling {kind!r} is not implemented "
            f"(Aner implements {', '.join(ROPE_SCALINGS)})",
            code="E-HF-CONFIG",
        )
    if kind == "linear":
        return theta, RopeScaling(kind, f.real("factor", 1.0)), local_theta
    scaling = RopeScaling(
        kind,
        f.real("factor", 1.0),
        f.real("low_freq_factor", 1.0),
        f.real("high_freq_factor", 4.0),
        f.integer("original_max_position_embeddings", 8192),
    )
    return theta, scaling, local_theta


_HF_ACTIVATIONS = {"silu": "silu", "gelu_tanh": "gelu_pytorch_tanh"}
"""HF's ``hidden_act``/``hidden_activation`` value of each `Architecture.activation`."""


def _hf_sliding(source: str, cfg: dict[str, Any], table: Architecture) -> dict[str, Any]:
    """The sliding-window fields of a config.json whose architecture has sliding layers:
    ``layer_types`` (or ``sliding_window_pattern``), ``sliding_window``, the softmax scale."""
    if not table.sliding_pattern:
        return {}
    f = _Fields(source, "E-HF-CONFIG", cfg)
    types = cfg.get("layer_types")
    if types is None:
        pattern = f.integer("sliding_window_pattern", table.sliding_pattern)
        types = every_nth_full(f.integer("num_hidden_layers"), pattern)
    if not isinstance(types, (list, tuple)):
        raise AnerRuntimeError(f"{source}: layer_types is {types!r}", code="E-HF-CONFIG")
    given = {key: cfg.get(key) is not None for key in ("sliding_window", "query_pre_attn_scalar")}
    return {
        "layer_types": tuple(str(t) for t in types),
        "sliding_window": f.integer("sliding_window") if given["sliding_window"] else None,
        "query_pre_attn_scalar": (
            f.real("query_pre_attn_scalar") if given["query_pre_attn_scalar"] else None
        ),
    }


def _hf_softcapping(source: str, cfg: dict[str, Any], table: Architecture) -> dict[str, Any]:
    """The soft-caps of a family that has them: each key's number, None where it is null, the
    family's default where it is absent (as transformers' config class defaults it)."""
    if table.softcapping is None:
        return {}
    f = _Fields(source, "E-HF-CONFIG", cfg)
    out: dict[str, float | None] = {}
    for key, default in zip(
        ("attn_logit_softcapping", "final_logit_softcapping"), table.softcapping
    ):
        out[key] = None if key in cfg and cfg[key] is None else f.real(key, default)
    return out


def _hf_longrope(source: str, cfg: dict[str, Any], params: dict[str, Any]) -> RopeScaling:
    """LongRoPE from config.json as transformers reads it: a top-level
    ``original_max_position_embeddings`` takes priority over the rope parameters' (Phi-3's
    configs keep it there); `factor` defaults to the context over that; `attention_factor` to
    `longrope_attention_factor`."""
    factors = {}
    for name in ("short_factor", "long_factor"):
        values = params.get(name)
        if not isinstance(values, list) or not all(
            isinstance(v, (int, float)) and not isinstance(v, bool) for v in values
        ):
            raise AnerRuntimeError(
                f"{source}: longrope {name} is {values!r}, not a list of numbers",
                code="E-HF-CONFIG",
            )
        factors[name] = tuple(float(v) for v in values)
    original = cfg.get("original_max_position_embeddings")
    original = params.get("original_max_position_embeddings") if original is None else original
    context = cfg.get("max_position_embeddings")
    if not (_positive_int(original) and _positive_int(context)):
        raise AnerRuntimeError(
            f"{source}: longrope needs positive integers original_max_position_embeddings and "
            f"max_position_embeddings, not {original!r} and {context!r}",
            code="E-HF-CONFIG",
        )
    factor = float(params.get("factor") or context / original)
    scale = params.get("attention_factor")
    return RopeScaling(
        "longrope",
        factor,
        original_max_position_embeddings=original,
        short_factor=factors["short_factor"],
        long_factor=factors["long_factor"],
        attention_factor=float(
            longrope_attention_factor(factor, original) if scale is None else scale
        ),
    )


def _positive_int(value: Any) -> TypeGuard[int]:
    return isinstance(value, int) and not isinstance(value, bool) and value > 0


def config_from_hf(cfg: Any, folder: Path) -> ModelConfig:
    """The model's hyper-parameters from a Hugging Face config.json, checked."""
    source = str(folder / "config.json")
    if not isinstance(cfg, dict):
        raise AnerRuntimeError(f"{source}: not a JSON object", code="E-HF-CONFIG")
    model_type = str(cfg.get("model_type", ""))
    table = for_hf(model_type)
    if table is None:
        known = [f"{m} folders" for t in ARCHITECTURES.values() for m in t.hf_model_types]
        raise _unknown_architecture(source, "E-HF-CONFIG", model_type, known)

    activation = _HF_ACTIVATIONS[table.activation]
    act_key = "hidden_activation" if cfg.get("hidden_activation") else "hidden_act"
    f = _Fields(source, "E-HF-CONFIG", cfg)
    unsupported = [
        f"{key} = {cfg[key]!r}"
        for key, fine in (
            (act_key, cfg.get(act_key, activation) == activation),
            ("mlp_bias", not cfg.get("mlp_bias")),
            ("attention_bias", not cfg.get("attention_bias") or bool(table.biased)),
            *(
                (key, cfg.get(key) is None or table.softcapping is not None)
                for key in ("attn_logit_softcapping", "final_logit_softcapping")
            ),
            ("use_bidirectional_attention", not cfg.get("use_bidirectional_attention")),
        )
        if not fine
    ]
    if unsupported:
        raise AnerRuntimeError(
            f"{source}: {', '.join(unsupported)} is not implemented for {model_type} models",
            code="E-HF-CONFIG",
        )
    hidden, heads = f.integer("hidden_size"), f.integer("num_attention_heads")
    context = f.integer("max_position_embeddings", 2048)
    sliding = bool(table.sliding_pattern)  # Gemma's window belongs to its sliding layers only
    if (
        cfg.get("sliding_window") is not None
        and cfg.get("use_sliding_window", True)
        and not sliding
    ):
        # beyond the window, attention would differ
        context = min(context, f.integer("sliding_window"))
    theta, scaling, local_theta = _hf_rope(source, cfg, local=table.sliding_rope)
    moe = _hf_experts(source, cfg, table.experts) if table.experts is not None else {}
    config = ModelConfig(
        **_hf_sliding(source, cfg, table),
        **_hf_softcapping(source, cfg, table),
        rope_local_theta=local_theta,
        vocab_size=f.integer("vocab_size"),
        hidden_size=hidden,
        intermediate_size=f.integer("intermediate_size"),
        num_hidden_layers=f.integer("num_hidden_layers"),
        num_attention_heads=heads,
        num_key_value_heads=f.integer("num_key_value_heads", heads),
        head_dim=f.integer("head_dim", max(hidden // heads, 1)),
        rms_norm_eps=f.real("rms_norm_eps", 1e-6),
        rope_theta=theta,
        max_position_embeddings=context,
        tie_word_embeddings=bool(cfg.get("tie_word_embeddings", False)),
        architecture=table.name,
        rope_scaling=scaling,
        partial_rotary_factor=float(_partial_rotary_factor(source, cfg)),
        **moe,
    )
    return _check(source, "E-HF-CONFIG", config)


def _partial_rotary_factor(source: str, cfg: dict[str, Any]) -> float:
    """config.json's ``partial_rotary_factor``, at the top level or among the rope parameters."""
    params = cfg.get("rope_parameters") or cfg.get("rope_scaling") or {}
    value = cfg.get("partial_rotary_factor", params.get("partial_rotary_factor", 1.0))
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value <= 1:
        raise AnerRuntimeError(
            f"{source}: partial_rotary_factor is {value!r}, not a number in (0, 1]",
            code="E-HF-CONFIG",
        )
    return float(value)


EXPERT_FIELDS = (
    "num_experts",
    "num_experts_per_tok",
    "moe_intermediate_size",
    "norm_topk_prob",
    "mlp_only_layers",
    "decoder_sparse_step",
    "router_aux_loss_coef",
)
"""`ModelConfig`'s mixture-of-experts fields, which config.json names per family
(`hf_expert_config`)."""
_ROUTING_FIELDS = ("norm_topk_prob", "mlp_only_layers", "decoder_sparse_step")
"""The fields (and config.json keys) of a family whose config says which layers are sparse and
whether the top-k weights are renormalised (`Experts.hf_routing`)."""
_COUNT_KEYS = ("num_experts", "num_local_experts")
"""transformers' two names of the expert count, one attribute for both families (the released
Qwen3-MoE configs write the first, transformers 5 saves the second)."""


def _hf_experts(source: str, cfg: dict[str, Any], experts: Experts) -> dict[str, Any]:
    """The mixture-of-experts fields of a Mixtral or Qwen3-MoE config.json under the family's
    keys (`Experts`), with HF's defaults (the family's top k, `Experts.hf_top_k`; routing:
    `norm_topk_prob` false, every layer sparse)."""
    f = _Fields(source, "E-HF-CONFIG", cfg)
    coef = f.real("router_aux_loss_coef", 0.001) if cfg.get("output_router_logits") else 0.0
    count = next((cfg[k] for k in _COUNT_KEYS if cfg.get(k) is not None), None)
    out = {
        "num_experts_per_tok": f.integer("num_experts_per_tok", experts.hf_top_k),
        "router_aux_loss_coef": coef,
        "num_experts": f.integer(experts.hf_count, count),
        "moe_intermediate_size": f.integer(experts.hf_size),
    }
    if not experts.hf_routing:
        return out
    only = cfg.get("mlp_only_layers") or []
    if not isinstance(only, list) or not all(type(i) is int for i in only):
        raise AnerRuntimeError(
            f"{source}: mlp_only_layers is {str(only)[:40]!r}, not a list of layer numbers",
            code="E-HF-CONFIG",
        )
    return {
        **out,
        "norm_topk_prob": bool(cfg.get("norm_topk_prob", False)),
        "mlp_only_layers": tuple(only),
        "decoder_sparse_step": f.integer("decoder_sparse_step", 1),
    }


def hf_expert_config(config: ModelConfig) -> dict[str, Any]:
    """The config.json keys of a mixture-of-experts model's expert fields as its family's
    transformers config names them (what `_hf_experts` reads back); none for a dense model.
    The load-balancing loss is on (``output_router_logits``) where its weight is positive."""
    experts = ARCHITECTURES[config.architecture].experts
    if experts is None:
        return {}
    out: dict[str, Any] = {
        experts.hf_count: config.num_experts,
        "num_experts_per_tok": config.num_experts_per_tok,
        experts.hf_size: config.moe_intermediate_size,
        "output_router_logits": config.router_aux_loss_coef > 0,
        "router_aux_loss_coef": config.router_aux_loss_coef,
    }
    if experts.hf_routing:
        out.update({k: getattr(config, k) for k in _ROUTING_FIELDS})
    return out


def gguf_hyperparameters(config: ModelConfig) -> dict[str, Any]:
    """The GGUF metadata keys llama.cpp's converter writes for these hyper-parameters (the inverse
    of `config_from_gguf`; Llama 3 rope scaling travels as the ``rope_freqs`` tensor instead)."""
    p = ARCHITECTURES[config.architecture].gguf_architectures[0] + "."
    keys: dict[str, Any] = {
        p + "context_length": config.max_position_embeddings,
        p + "embedding_length": config.hidden_size,
        p + "feed_forward_length": config.intermediate_size,
        p + "block_count": config.num_hidden_layers,
        p + "attention.head_count": config.num_attention_heads,
        p + "attention.head_count_kv": config.num_key_value_heads,
        p + "attention.key_length": config.head_dim,
        p + "attention.value_length": config.head_dim,
        p + "attention.layer_norm_rms_epsilon": float(config.rms_norm_eps),
        p + "rope.freq_base": float(config.rope_theta),
        p + "rope.dimension_count": config.rotary_dim,
        p + "vocab_size": config.vocab_size,
    }
    s = config.rope_scaling
    if s is not None and s.rope_type == "linear":
        keys[p + "rope.scaling.type"] = "linear"
        keys[p + "rope.scaling.factor"] = float(s.factor)
    if s is not None and s.rope_type == "longrope":  # the factors travel as tensors
        keys[p + "rope.scaling.original_context_length"] = s.original_max_position_embeddings
        keys[p + "rope.scaling.attn_factor"] = float(s.attention_factor)
    table = ARCHITECTURES[config.architecture]
    if table.sliding_pattern:
        _check_llamacpp_sliding(config, table)
        keys[p + "attention.sliding_window"] = config.sliding_window
    if table.softcapping is not None:  # _check_llamacpp_sliding refused a missing cap
        attention, final = _softcap_keys(table)
        keys[attention] = config.attn_logit_softcapping
        keys[final] = config.final_logit_softcapping
    if config.num_experts:
        _check_llamacpp_experts(config)
        arch = p.removesuffix(".")
        keys[_expert_key("EXPERT_COUNT", arch)] = config.num_experts
        keys[_expert_key("EXPERT_USED_COUNT", arch)] = config.num_experts_per_tok
        keys[_expert_key("EXPERT_FEED_FORWARD_LENGTH", arch)] = config.moe_intermediate_size
    return keys


def _check_llamacpp_experts(config: ModelConfig) -> None:
    """Refuse a mixture-of-experts layout that llama.cpp would read differently from a GGUF: its
    graphs make every layer sparse and renormalise the top-k routing weights."""
    dense = [i for i in range(config.num_hidden_layers) if not config.experts_in(i)]
    differ = [f"dense MLP layers {dense}"] if dense else []
    if not config.norm_topk_prob:
        differ.append("top-k routing weights that are not renormalised (norm_topk_prob false)")
    if differ:
        raise AnerRuntimeError(
            f"export_gguf: this {config.architecture} model has {' and '.join(differ)}, which "
            "llama.cpp's GGUF graph does not have (every layer sparse, weights renormalised), "
            "so no GGUF file would be read the same way",
            code="E-EXPORT",
            notes=("save_adapter(adapter, dir, format: safetensors) keeps a trained adapter",),
        )


def _check_llamacpp_sliding(config: ModelConfig, table: Architecture) -> None:
    """Refuse a sliding-window layout that llama.cpp would read differently from a GGUF (it
    assumes the architecture's layer pattern, sliding rope base and softmax scale, and caps a
    soft-capping family's scores and logits always: a cap of None has no GGUF form)."""
    layers = config.num_hidden_layers
    caps = ("attn_logit_softcapping", "final_logit_softcapping")
    assumed: dict[str, Any] = {
        "layer_types": every_nth_full(layers, table.sliding_pattern),
        "rope_local_theta": LOCAL_THETA if table.sliding_rope else None,
        "query_pre_attn_scalar": _llamacpp_scalar(
            table, layers, config.hidden_size, config.num_attention_heads, config.head_dim
        ),
    }
    if table.softcapping is not None:
        assumed.update({f: getattr(config, f) or d for f, d in zip(caps, table.softcapping)})
    differ = [
        f"{f} {getattr(config, f)!r} (llama.cpp assumes {value!r})"
        for f, value in assumed.items()
        if getattr(config, f) != value
    ]
    if differ:
        raise AnerRuntimeError(
            f"export_gguf: this {config.architecture} model's {'; '.join(differ)} cannot be "
            "written to a GGUF file that llama.cpp reads the same way",
            code="E-EXPORT",
        )


def longrope_tensors(config: ModelConfig) -> dict[str, torch.Tensor]:
    """LongRoPE's factors as the f32 tensors llama.cpp's converter writes (none without it)."""
    import torch

    s = config.rope_scaling
    if s is None or s.rope_type != "longrope":
        return {}
    long, short = ARCHITECTURES[config.architecture].rope_factors
    return {
        long: torch.tensor(s.long_factor, dtype=torch.float32),
        short: torch.tensor(s.short_factor, dtype=torch.float32),
    }

"""Model hyper-parameters, named as in Hugging Face configs, read from a GGUF's metadata or a
folder's config.json and checked before any tensor is read.

Both file kinds give the one `ModelConfig`; what differs between architectures (biases, q/k
norms, GGUF permutations) is a fact of its table in `aner_lang.architectures`, named by
`ModelConfig.architecture`, not a field here. The checks make a bad file fail with its path and
the offending value before any large allocation: positive sizes, a head count the key/value head
count divides, an even head size (rope rotates pairs), finite positive epsilon and rope
parameters, a rope scaling Aner implements.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from aner_lang.architectures import ARCHITECTURES, Architecture, for_gguf, for_hf
from aner_lang.errors import AnerRuntimeError

if TYPE_CHECKING:
    import torch

    from aner_lang.runtime.io.gguf import GGUFFile

ROPE_SCALINGS = ("llama3", "linear")
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
    later: low frequencies slowed by `factor`, a smooth ramp between) or ``linear``."""

    rope_type: str
    factor: float
    low_freq_factor: float = 1.0
    high_freq_factor: float = 4.0
    original_max_position_embeddings: int = 8192


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

    def sliding(self, layer: int) -> bool:
        """Whether `layer` attends over a sliding window."""
        return bool(self.layer_types) and self.layer_types[layer] == SLIDING

    @property
    def q_size(self) -> int:
        return self.num_attention_heads * self.head_dim

    @property
    def kv_size(self) -> int:
        return self.num_key_value_heads * self.head_dim

    def dims(self, fields: tuple[str, ...]) -> tuple[int, ...]:
        """A weight's shape (HF layout) from the config fields an architecture table names."""
        return tuple(int(getattr(self, f)) for f in fields)


def rope_freq_factors(config: ModelConfig) -> torch.Tensor | None:
    """Per-frequency divisors of the rope inverse frequencies (`head_dim // 2` values), or None.

    ``llama3``: computed as llama.cpp's converter writes them to ``rope_freqs.weight`` (HF's
    `rope_type="llama3"`): 1 for wavelengths shorter than `original / high_freq_factor`, `factor`
    for those longer than `original / low_freq_factor`, a smooth ramp between. ``linear``:
    `factor` everywhere (positions divided by the factor). torch is imported here, not with the
    module: `aner plan` reads configs without it."""
    import torch

    s = config.rope_scaling
    if s is None:
        return None
    half = config.head_dim // 2
    if s.rope_type == "linear":
        return torch.full((half,), float(s.factor))
    freqs = [config.rope_theta ** (-2.0 * i / config.head_dim) for i in range(half)]
    low_wavelen = s.original_max_position_embeddings / s.low_freq_factor
    high_wavelen = s.original_max_position_embeddings / s.high_freq_factor
    factors = []
    for freq in freqs:
        wavelen = 2 * math.pi / freq
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


def _check(source: str, code: str, c: ModelConfig) -> ModelConfig:
    def bad(what: str) -> AnerRuntimeError:
        return AnerRuntimeError(f"{source}: {what}", code=code)

    for field in (
        "vocab_size",
        "hidden_size",
        "intermediate_size",
        "num_hidden_layers",
        "num_attention_heads",
        "num_key_value_heads",
        "head_dim",
        "max_position_embeddings",
    ):
        if int(getattr(c, field)) <= 0:
            raise bad(f"{field} is {getattr(c, field)}; it must be positive")
    if c.num_attention_heads % c.num_key_value_heads:
        raise bad(
            f"inconsistent attention shape: {c.num_attention_heads} heads, "
            f"{c.num_key_value_heads} KV heads (the KV head count must divide the head count)"
        )
    if c.head_dim % 2:
        raise bad(f"head size {c.head_dim} is odd; rope rotates pairs of dimensions")
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
    for field in ("query_pre_attn_scalar", "rope_local_theta"):
        v = getattr(c, field)
        if v is not None and (not math.isfinite(float(v)) or float(v) <= 0):
            raise bad(f"{field} is {v}; it must be a finite positive number")
    s = c.rope_scaling
    if s is not None:
        values = (s.factor, s.low_freq_factor, s.high_freq_factor)
        if not all(math.isfinite(v) and v > 0 for v in values):
            raise bad(f"rope scaling {s} has a factor that is not a finite positive number")
        if s.rope_type == "llama3" and (
            s.high_freq_factor <= s.low_freq_factor or s.original_max_position_embeddings <= 0
        ):
            raise bad(f"llama3 rope scaling {s} needs high_freq_factor > low_freq_factor")
    return c


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
    table = for_gguf(arch)
    if table is None:
        known = [a for t in ARCHITECTURES.values() for a in t.gguf_architectures]
        raise _unknown_architecture(
            str(gguf.path), "E-GGUF-ARCH", arch, [f"{k} GGUF files" for k in known]
        )
    p = f"{arch}."
    meta = gguf.metadata

    def num(key: str, default: Any = None) -> Any:
        value = gguf.require(p + key) if default is None else meta.get(p + key, default)
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise AnerRuntimeError(
                f"{gguf.path}: metadata key {p + key!r} is {value!r}, not a number",
                code="E-GGUF-METADATA",
            )
        return value

    hidden = int(num("embedding_length"))
    heads = int(num("attention.head_count"))
    vocab = meta.get(p + "vocab_size")
    if vocab is None:
        vocab = len(gguf.require("tokenizer.ggml.tokens"))
    head_dim = int(num("attention.key_length", hidden // max(heads, 1)))
    rotary = int(num("rope.dimension_count", head_dim))
    if rotary != head_dim:
        raise AnerRuntimeError(
            f"{gguf.path}: rope covers {rotary} of the {head_dim} dimensions of a head; "
            "Aner implements rope over whole heads",
            code="E-GGUF-METADATA",
        )
    scaling = None
    kind = str(meta.get(p + "rope.scaling.type", "none"))
    if kind == "linear":
        scaling = RopeScaling("linear", float(num("rope.scaling.factor")))
    elif kind != "none":
        raise AnerRuntimeError(
            f"{gguf.path}: rope scaling {kind!r} is not implemented "
            f"(Aner implements {', '.join(ROPE_SCALINGS)})",
            code="E-GGUF-METADATA",
        )
    config = ModelConfig(
        **_gguf_sliding(gguf, table, num),
        vocab_size=int(vocab),
        hidden_size=hidden,
        intermediate_size=int(num("feed_forward_length")),
        num_hidden_layers=int(num("block_count")),
        num_attention_heads=heads,
        num_key_value_heads=int(num("attention.head_count_kv", heads)),
        head_dim=head_dim,
        rms_norm_eps=float(num("attention.layer_norm_rms_epsilon", 1e-5)),
        rope_theta=float(num("rope.freq_base", 10000.0)),
        max_position_embeddings=int(num("context_length", 2048)),
        tie_word_embeddings=not gguf.has_tensor(table.output),
        architecture=table.name,
        rope_scaling=scaling,
    )
    return _check(str(gguf.path), "E-GGUF-METADATA", config)


def _gguf_sliding(gguf: GGUFFile, table: Architecture, num: Any) -> dict[str, Any]:
    """The sliding-window fields of a GGUF as llama.cpp reads them: the window from
    ``attention.sliding_window``, the layer pattern the architecture implies (or
    ``attention.sliding_window_pattern``), the sliding layers' rope base (``rope.freq_base_swa``,
    else 10000), and llama.cpp's softmax scale (1/sqrt(head size); 1/sqrt(hidden/heads) for
    Gemma 3 27B, the 62-layer one)."""
    if not table.sliding_pattern:
        return {}
    p = f"{gguf.architecture}."
    keys = ("block_count", "embedding_length", "attention.head_count")
    layers, hidden, heads = (max(int(num(k)), 1) for k in keys)
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
    head_dim = int(num("attention.key_length", hidden // max(heads, 1)))
    return {
        "sliding_window": int(num("attention.sliding_window")),
        "layer_types": types,
        "rope_local_theta": float(num("rope.freq_base_swa", LOCAL_THETA)),
        "query_pre_attn_scalar": float(hidden // heads if layers == 62 else head_dim),
    }


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
    local_theta = None
    if local:
        by_type = params if FULL in params else {}
        sliding = by_type.get(SLIDING) or {}
        local_theta = float(sliding.get("rope_theta", cfg.get("rope_local_base_freq", LOCAL_THETA)))
        if sliding.get("rope_type", "default") != "default":
            raise AnerRuntimeError(
                f"{source}: rope scaling of sliding layers is not implemented", code="E-HF-CONFIG"
            )
        params = by_type.get(FULL) or params
    theta = float(params.get("rope_theta", cfg.get("rope_theta", 10000.0)))
    kind = params.get("rope_type", params.get("type", "default"))
    if kind == "default":
        return theta, None, local_theta
    if kind not in ROPE_SCALINGS:
        raise AnerRuntimeError(
            f"{source}: rope scaling {kind!r} is not implemented "
            f"(Aner implements {', '.join(ROPE_SCALINGS)})",
            code="E-HF-CONFIG",
        )
    fields = {
        k: params[k]
        for k in ("low_freq_factor", "high_freq_factor", "original_max_position_embeddings")
        if k in params and kind == "llama3"
    }
    return theta, RopeScaling(kind, float(params.get("factor", 1.0)), **fields), local_theta


_HF_ACTIVATIONS = {"silu": "silu", "gelu_tanh": "gelu_pytorch_tanh"}
"""HF's ``hidden_act``/``hidden_activation`` value of each `Architecture.activation`."""


def _hf_sliding(source: str, cfg: dict[str, Any], table: Architecture) -> dict[str, Any]:
    """The sliding-window fields of a config.json whose architecture has sliding layers:
    ``layer_types`` (or ``sliding_window_pattern``), ``sliding_window``, the softmax scale."""
    if not table.sliding_pattern:
        return {}
    layers = cfg.get("num_hidden_layers")
    types = cfg.get("layer_types")
    if types is None and isinstance(layers, int) and layers > 0:
        pattern = cfg.get("sliding_window_pattern", table.sliding_pattern)
        if not isinstance(pattern, int) or pattern <= 0:
            raise AnerRuntimeError(
                f"{source}: sliding_window_pattern is {pattern!r}, not a positive count",
                code="E-HF-CONFIG",
            )
        types = every_nth_full(layers, pattern)
    if not isinstance(types, (list, tuple)):
        raise AnerRuntimeError(f"{source}: layer_types is {types!r}", code="E-HF-CONFIG")
    window, scalar = cfg.get("sliding_window"), cfg.get("query_pre_attn_scalar")
    for key, value in (("sliding_window", window), ("query_pre_attn_scalar", scalar)):
        if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float))):
            raise AnerRuntimeError(
                f"{source}: {key} is {value!r}, not a number", code="E-HF-CONFIG"
            )
    return {
        "layer_types": tuple(str(t) for t in types),
        "sliding_window": int(window) if window is not None else None,
        "query_pre_attn_scalar": float(scalar) if scalar is not None else None,
    }


def config_from_hf(cfg: dict[str, Any], folder: Path) -> ModelConfig:
    """The model's hyper-parameters from a Hugging Face config.json, checked."""
    source = str(folder / "config.json")
    model_type = str(cfg.get("model_type", ""))
    table = for_hf(model_type)
    if table is None:
        known = [f"{m} folders" for t in ARCHITECTURES.values() for m in t.hf_model_types]
        raise _unknown_architecture(source, "E-HF-CONFIG", model_type, known)

    def field(key: str, default: Any = None) -> Any:
        value = cfg.get(key, default)
        if value is None or isinstance(value, bool) or not isinstance(value, (int, float)):
            raise AnerRuntimeError(
                f"{source}: {key} is {value!r}, not a number", code="E-HF-CONFIG"
            )
        return value

    activation = _HF_ACTIVATIONS[table.activation]
    act_key = "hidden_activation" if cfg.get("hidden_activation") else "hidden_act"
    unsupported = [
        f"{key} = {cfg[key]!r}"
        for key, fine in (
            (act_key, cfg.get(act_key, activation) == activation),
            ("mlp_bias", not cfg.get("mlp_bias")),
            ("attention_bias", not cfg.get("attention_bias") or bool(table.biased)),
            ("attn_logit_softcapping", cfg.get("attn_logit_softcapping") is None),
            ("final_logit_softcapping", cfg.get("final_logit_softcapping") is None),
            ("use_bidirectional_attention", not cfg.get("use_bidirectional_attention")),
        )
        if not fine
    ]
    if unsupported:
        raise AnerRuntimeError(
            f"{source}: {', '.join(unsupported)} is not implemented for {model_type} models",
            code="E-HF-CONFIG",
        )
    hidden, heads = int(field("hidden_size")), int(field("num_attention_heads"))
    context = int(field("max_position_embeddings", 2048))
    window = cfg.get("sliding_window")
    sliding = bool(table.sliding_pattern)
    if isinstance(window, int) and window > 0 and cfg.get("use_sliding_window", True):
        if not sliding:  # beyond the window, attention would differ
            context = min(context, window)
    theta, scaling, local_theta = _hf_rope(source, cfg, local=sliding)
    config = ModelConfig(
        **_hf_sliding(source, cfg, table),
        rope_local_theta=local_theta,
        vocab_size=int(field("vocab_size")),
        hidden_size=hidden,
        intermediate_size=int(field("intermediate_size")),
        num_hidden_layers=int(field("num_hidden_layers")),
        num_attention_heads=heads,
        num_key_value_heads=int(field("num_key_value_heads", heads)),
        head_dim=int(cfg.get("head_dim") or hidden // max(heads, 1)),
        rms_norm_eps=float(field("rms_norm_eps", 1e-6)),
        rope_theta=theta,
        max_position_embeddings=context,
        tie_word_embeddings=bool(cfg.get("tie_word_embeddings", False)),
        architecture=table.name,
        rope_scaling=scaling,
    )
    return _check(source, "E-HF-CONFIG", config)


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
        p + "rope.dimension_count": config.head_dim,
        p + "vocab_size": config.vocab_size,
    }
    if config.rope_scaling is not None and config.rope_scaling.rope_type == "linear":
        keys[p + "rope.scaling.type"] = "linear"
        keys[p + "rope.scaling.factor"] = float(config.rope_scaling.factor)
    table = ARCHITECTURES[config.architecture]
    if table.sliding_pattern:
        _check_llamacpp_sliding(config, table)
        keys[p + "attention.sliding_window"] = config.sliding_window
    return keys


def _check_llamacpp_sliding(config: ModelConfig, table: Architecture) -> None:
    """Refuse a sliding-window layout that llama.cpp would read differently from a GGUF (it
    assumes the architecture's layer pattern, sliding rope base and softmax scale)."""
    layers = config.num_hidden_layers
    llamacpp = ModelConfig(
        **{
            **config.__dict__,
            "layer_types": every_nth_full(layers, table.sliding_pattern),
            "rope_local_theta": LOCAL_THETA,
            "query_pre_attn_scalar": float(
                config.hidden_size // config.num_attention_heads
                if layers == 62
                else config.head_dim
            ),
        }
    )
    differ = [
        f"{f} {getattr(config, f)!r} (llama.cpp assumes {getattr(llamacpp, f)!r})"
        for f in ("layer_types", "rope_local_theta", "query_pre_attn_scalar")
        if getattr(config, f) != getattr(llamacpp, f)
    ]
    if differ:
        raise AnerRuntimeError(
            f"export_gguf: this {config.architecture} model's {'; '.join(differ)} cannot be "
            "written to a GGUF file that llama.cpp reads the same way",
            code="E-EXPORT",
        )

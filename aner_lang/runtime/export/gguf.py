"""Writing a model (a base, or a merged adapter) back to GGUF.

`export_gguf(model, path, dtype)` writes llama.cpp's layout: GGUF tensor names, q/k rows permuted
back to interleaved-pair RoPE order, norms in f32, every metadata key (tokenizer, chat template,
hyper-parameters) copied from the source GGUF, so llama.cpp, HF transformers and our loader all
read it.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import torch

from aner_lang.architectures import Norm
from aner_lang.errors import AnerRuntimeError
from aner_lang.runtime.io.gguf import permute_rows

DTYPES = {"f16": np.float16, "f32": np.float32}
_FILE_TYPE = {"f32": 0, "f16": 1}  # llama.cpp's LLAMA_FTYPE_ALL_F32 / MOSTLY_F16
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


def export_gguf(model: Any, path: str | Path, dtype: str = "f16") -> Path:
    """Write `model` (a base or a merged adapter) as a GGUF file of `dtype` weights."""
    import gguf

    if dtype not in DTYPES:
        raise AnerRuntimeError(
            f"export_gguf: unknown dtype {dtype!r}; expected one of {', '.join(DTYPES)}",
            code="E-EXPORT",
        )
    if hasattr(model, "targets") and not hasattr(model, "module"):
        raise AnerRuntimeError(
            "export_gguf needs a model; merge the adapter first: export_gguf(merge(adapter), path)",
            code="E-EXPORT",
        )
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(f".{out.name}.tmp")
    writer = gguf.GGUFWriter(str(tmp), model.architecture.gguf_architectures[0])
    source = _copy_metadata(writer, Path(model.path))
    writer.add_file_type(_FILE_TYPE[dtype])
    writer.add_quantization_version(gguf.GGML_QUANT_VERSION)
    with torch.no_grad():
        for name, t in _gguf_tensors(model):
            data = t.detach().float().cpu().numpy()
            writer.add_tensor(name, data if data.ndim == 1 else data.astype(DTYPES[dtype]))
        for t in source.tensors:
            if t.name == model.architecture.rope_freqs:
                writer.add_tensor(t.name, np.array(t.data, dtype=np.float32))
        writer.write_header_to_file()
        writer.write_kv_data_to_file()
        writer.write_tensors_to_file()
        writer.close()
    tmp.replace(out)
    return out


def export_gguf_builtin(ctx: Any, *, model: Any, path: str, dtype: str = "f16") -> str:
    """Builtin `export_gguf`: `path` is relative to the script; returns the file written."""
    return str(export_gguf(model, ctx.resolve_path(path), dtype))

"""Writing a model (a base, or a merged adapter) back to GGUF.

`export_gguf(model, path, dtype)` writes llama.cpp's layout for the model's architecture (the
one it came from: a Qwen2 model is written as ``qwen2``): GGUF tensor names, q/k rows permuted
back to interleaved-pair RoPE order where llama.cpp permutes them, norms, biases, and Llama 3's
``rope_freqs`` and LongRoPE's ``rope_factors_long``/``rope_factors_short`` in f32. Metadata
(tokenizer, chat template, hyper-parameters) is copied from a source GGUF; a model read from a
Hugging Face folder is described as llama.cpp's converter would describe it. llama.cpp, HF
transformers and our loader all read the result. `dtype` is a file type of `filetypes` (f32,
f16, or llama.cpp's quantized q8_0 and q4_k_m mixes); Q8_0 and Q5_0 blocks are written by
`gguf.quants`, Q4_K and Q6_K by `kquants`.
"""

from __future__ import annotations

from collections.abc import Iterator
from itertools import groupby
from pathlib import Path
from typing import Any

import numpy as np
import torch

from aner_lang.problems.errors import AnerRuntimeError
from aner_lang.runtime.export import filetypes, kquants
from aner_lang.runtime.export.files import gguf_writer, module_tensor, require_model
from aner_lang.runtime.io.gguf import GGUFFile, permute_rows
from aner_lang.runtime.io.world import once
from aner_lang.runtime.model.config import gguf_hyperparameters, longrope_tensors

_SKIPPED_KEYS = ("GGUF.", "general.file_type", "general.quantization_version")


def _gguf_tensors(model: Any) -> Iterator[tuple[str, torch.Tensor]]:
    """(GGUF name, fp32 tensor in the file's layout) for every weight, as the model's
    architecture table names and permutes them (`Architecture.weights`); the experts' matrices
    of one projection stacked into its 3-D ``[experts, out, in]`` tensor, as llama.cpp stores
    them."""
    m, c = model.module, model.config
    weights = model.architecture.weights(c.num_hidden_layers, c.tie_word_embeddings, c.experts_in)
    for name, group in groupby(weights, key=lambda w: w.gguf):
        parts = []
        for w in group:
            t = module_tensor(m, w)
            if w.rope_heads:
                t = permute_rows(t, int(getattr(c, w.rope_heads)))
            parts.append(t)
        yield name, parts[0] if len(parts) == 1 else torch.stack(parts)
    if model.rope_freqs is not None:
        yield model.architecture.rope_freqs, model.rope_freqs
    yield from longrope_tensors(c).items()


def _copy_metadata(writer: Any, source: Path, tokenizer: Any) -> None:
    """Every key of the source GGUF except the ones describing its own tensor encoding, with the
    chat template and end-of-turn token the model was loaded with (`_tokenizer_changes`)."""
    import gguf

    try:
        file = GGUFFile(source)
    except AnerRuntimeError as e:
        raise AnerRuntimeError(
            f"export_gguf: cannot read the source model {source} to copy its metadata "
            f"({e.message})",
            code="E-EXPORT",
        ) from None
    changes = _tokenizer_changes(tokenizer, file.metadata)
    for key, value in file.metadata.items():
        if key.startswith(_SKIPPED_KEYS) or key == "general.architecture" or key in changes:
            continue
        vtype, item = file.value_types[key]
        sub = gguf.GGUFValueType(item) if item is not None else None
        writer.add_key_value(key, value, gguf.GGUFValueType(vtype), sub_type=sub)
    write_keys(writer, changes)


def _tokenizer_changes(tokenizer: Any, meta: dict[str, Any]) -> dict[str, Any]:
    """The tokenizer keys where the model differs from its source file: a chat template given to
    `load_model`, and the end-of-turn token it adds to the file's end-of-generation ids (written
    as ``tokenizer.ggml.eot_token_id`` when the file names none, so llama.cpp stops there too)."""
    changes: dict[str, Any] = {}
    if tokenizer.chat_template and tokenizer.chat_template != meta.get("tokenizer.chat_template"):
        changes["tokenizer.chat_template"] = tokenizer.chat_template
    named = {meta.get(f"tokenizer.ggml.{k}_token_id") for k in ("eos", "eot", "eom")}
    added = sorted(tokenizer.stop_ids - named)
    if len(added) == 1 and "tokenizer.ggml.eot_token_id" not in meta:
        changes["tokenizer.ggml.eot_token_id"] = added[0]
    return changes


def _folder_metadata(writer: Any, model: Any) -> None:
    """A Hugging Face folder's model described as llama.cpp's converter describes it: name,
    hyper-parameters and the tokenizer's vocabulary, special ids and chat template."""
    tokenizer = model.tokenizer.gguf_metadata(model.config.vocab_size)
    if tokenizer is None:
        raise AnerRuntimeError(
            f"export_gguf: the tokenizer of {model.path} has no GGUF form Aner can write "
            "(GGUF export of a folder's model needs a byte-level BPE tokenizer.json whose "
            "pre-tokenizer llama.cpp knows: Llama 3, Qwen2, Tekken or GPT-2)",
            code="E-EXPORT",
        )
    write_keys(
        writer, {"general.name": model.name, **gguf_hyperparameters(model.config), **tokenizer}
    )


def write_keys(writer: Any, keys: dict[str, Any]) -> None:
    """Metadata values with the GGUF types llama.cpp reads them as: integers u32 (token types
    i32), floats f32, strings, booleans, and arrays of one of those."""
    import gguf

    t = gguf.GGUFValueType

    def vtype(value: Any, key: str) -> Any:
        if isinstance(value, bool):
            return t.BOOL
        if isinstance(value, int):
            return t.INT32 if key.endswith("token_type") or value < 0 else t.UINT32
        if isinstance(value, float):
            return t.FLOAT32
        return t.STRING

    for key, value in keys.items():
        if isinstance(value, list):
            sub = vtype(value[0], key) if value else t.STRING
            writer.add_key_value(key, value, t.ARRAY, sub_type=sub)
        else:
            writer.add_key_value(key, value, vtype(value, key))


def _encoded(t: torch.Tensor, kind: str) -> tuple[np.ndarray, Any]:
    """`t` as GGUF stores `kind`: the array to write and its raw tensor type (None: numpy's)."""
    import gguf

    data = t.detach().float().cpu().numpy()
    if kind == filetypes.F32:
        return data, None
    if kind == filetypes.F16:
        return data.astype(np.float16), None
    qtype = gguf.GGMLQuantizationType[kind]
    if kind in (filetypes.Q4_K, filetypes.Q6_K):  # rows of blocks; an expert tensor's rows too
        rows = kquants.quantize(data.reshape(-1, data.shape[-1]), kind)
        return rows.reshape(*data.shape[:-1], rows.shape[-1]), qtype
    return gguf.quants.quantize(data, qtype), qtype


def export_gguf(
    model: Any, path: str | Path, dtype: str = "f16", *, overwrite: bool = False
) -> Path:
    """Write `model` (a base or a merged adapter) as a GGUF file of file type `dtype`: an existing
    file only with `overwrite`, and never the model's own source file (`aner_lang.host.files`)."""
    import gguf

    ft = filetypes.file_type(dtype)
    require_model(model, "export_gguf")
    arch = model.architecture
    output = arch.embedding if model.module.lm_head is model.module.embed_tokens else arch.output
    layers = model.config.num_hidden_layers
    with (
        gguf_writer(
            path, arch.gguf_architectures[0], overwrite=overwrite, protected=[model.path]
        ) as writer,
        torch.no_grad(),
    ):
        if Path(model.path).is_dir():
            _folder_metadata(writer, model)
        else:
            _copy_metadata(writer, Path(model.path), model.tokenizer)
        writer.add_file_type(ft.ftype)
        writer.add_quantization_version(gguf.GGML_QUANT_VERSION)
        for name, t in _gguf_tensors(model):
            kind = filetypes.tensor_type(ft, name, tuple(t.shape), layers, output)
            data, raw_dtype = _encoded(t, kind)
            writer.add_tensor(name, data, raw_dtype=raw_dtype)
    return Path(path)


def export_gguf_builtin(
    ctx: Any, *, model: Any, path: str, dtype: str = "f16", overwrite: bool = False
) -> str:
    """Builtin `export_gguf`: `path` is relative to the script; returns the file written (by
    rank 0 alone in a distributed run)."""
    out = ctx.resolve_path(path)
    return str(once(export_gguf, model, out, dtype, overwrite=overwrite) or out)

"""GGUF file types: which tensor type each weight of an exported file gets, as llama.cpp decides.

A file type names a mix, not one tensor type: llama.cpp's `llama-quantize` keeps 1-D tensors
(norms, biases, rope factors) in f32 and picks a type per weight from the tensor's GGUF name and
layer. This module follows `llama_tensor_get_type` of llama.cpp (src/llama-quant.cpp) for the
types Aner writes, so an Aner `q4_k_m` file is the file `llama-quantize ... Q4_K_M` makes:

* ``q8_0``: every 2-D weight Q8_0.
* ``q4_k_m``: Q4_K, except the output matrix (the token embedding when the model ties them)
  Q6_K; ``attn_v`` and ``ffn_down`` Q6_K in the layers llama.cpp gives more bits (the first and
  last eighth of the layers, and every third layer between), else Q4_K.
* A mixture-of-experts router (``ffn_gate_inp``) stays f32, as llama.cpp's converter and
  quantizer keep it; ``ffn_down_exps`` (every expert's down projection) counts as ``ffn_down``.
* A weight whose rows are not a multiple of a type's block falls back as llama.cpp does:
  Q4_K -> Q5_0, Q6_K -> Q8_0, then f16 when even that block does not divide the row.

The rules key on GGUF tensor names (``blk.N.attn_v.weight``), which are llama.cpp's names for
every architecture; the names themselves come from the architecture table.
"""

from __future__ import annotations

from dataclasses import dataclass

from aner_lang.problems.errors import AnerRuntimeError

F32, F16, Q8_0, Q5_0, Q4_K, Q6_K = "F32", "F16", "Q8_0", "Q5_0", "Q4_K", "Q6_K"
BLOCK = {F32: 1, F16: 1, Q8_0: 32, Q5_0: 32, Q4_K: 256, Q6_K: 256}
_FALLBACK = {Q4_K: Q5_0, Q6_K: Q8_0, Q8_0: F16, Q5_0: F16}


@dataclass(frozen=True)
class FileType:
    name: str
    """As Aner spells it (the `GGUFDtype` member)."""
    ftype: int
    """llama.cpp's `llama_ftype`, written as ``general.file_type``."""
    default: str
    """The tensor type of a 2-D weight no rule changes."""
    doc: str


FILE_TYPES: dict[str, FileType] = {
    t.name: t
    for t in (
        FileType("f32", 0, F32, "every tensor f32"),
        FileType("f16", 1, F16, "weights f16, 1-D tensors f32"),
        FileType("q8_0", 7, Q8_0, "weights Q8_0 (8.5 bits a weight), 1-D tensors f32"),
        FileType(
            "q4_k_m",
            15,
            Q4_K,
            "llama.cpp's Q4_K_M mix: Q4_K weights, Q6_K for the output and some attn_v/ffn_down",
        ),
    )
}


def file_type(name: str) -> FileType:
    if name not in FILE_TYPES:
        raise AnerRuntimeError(
            f"export_gguf: unknown dtype {name!r}; expected one of {', '.join(FILE_TYPES)}",
            code="E-EXPORT",
        )
    return FILE_TYPES[name]


def _more_bits(layer: int, layers: int) -> bool:
    """llama.cpp's `use_more_bits`: the layers its K-quant mixes give a bigger type."""
    return layer < layers // 8 or layer >= 7 * layers // 8 or (layer - layers // 8) % 3 == 2


def _layer_and_stem(name: str) -> tuple[int | None, str]:
    parts = name.split(".")
    if parts[0] == "blk" and len(parts) >= 3:
        return int(parts[1]), parts[2]
    return None, parts[0]


def tensor_type(ft: FileType, name: str, shape: tuple[int, ...], layers: int, output: str) -> str:
    """The tensor type of `name` (GGUF name, numpy `shape`) in a file of type `ft`; `output` is
    the name of the tensor that serves as the output matrix (the embedding when tied)."""
    layer, stem = _layer_and_stem(name)
    if len(shape) < 2 or stem == "ffn_gate_inp":
        return F32
    chosen = ft.default
    if ft.name == "q4_k_m":
        if name == output:
            chosen = Q6_K
        elif (
            stem in ("attn_v", "ffn_down", "ffn_down_exps")
            and layer is not None
            and _more_bits(layer, layers)
        ):
            chosen = Q6_K
    while shape[-1] % BLOCK[chosen]:
        chosen = _FALLBACK[chosen]
    return chosen

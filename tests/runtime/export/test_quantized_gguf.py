"""llama.cpp's file types: K-quant blocks read back by gguf's reader, the per-tensor mix of
`q4_k_m`, and quantized exports of the tiny model read back by Aner's loader."""

from __future__ import annotations

import gguf
import numpy as np
import pytest
import torch
from gguf import quants

from aner_lang.builtins import members
from aner_lang.runtime.export import filetypes, kquants
from aner_lang.runtime.export.gguf import export_gguf
from aner_lang.runtime.load.loader import load_model


def _weights(rows: int, cols: int, seed: int = 0) -> np.ndarray:
    x = np.random.default_rng(seed).standard_normal((rows, cols)).astype(np.float32) * 0.02
    x[1] = 0.0  # an all-zero row
    x[2, :256] = 0.5  # a constant super-block
    x[3, :16] = 7.0  # an outlier sub-block
    return x


def _relative_rmse(kind: str, x: np.ndarray) -> float:
    back = quants.dequantize(kquants.quantize(x, kind), gguf.GGMLQuantizationType[kind])
    assert back.shape == x.shape
    assert np.all(back[1] == 0.0)
    return float(np.sqrt(((back - x) ** 2).mean() / (x**2).mean()))


@pytest.mark.parametrize(("kind", "bits_bound"), [("Q4_K", 0.05), ("Q6_K", 0.013)])
def test_k_quant_blocks_read_back_within_their_precision(kind: str, bits_bound: float) -> None:
    x = _weights(48, 1536)
    size = gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType[kind]]
    assert kquants.quantize(x, kind).shape == (48, 1536 // size[0] * size[1])
    assert _relative_rmse(kind, x) < bits_bound
    # a better type than the 4/5-bit block types gguf writes, at about their size
    q4_0 = quants.dequantize(quants.quantize(x, gguf.GGMLQuantizationType.Q4_0), 2)
    assert _relative_rmse("Q4_K", x) < np.sqrt(((q4_0 - x) ** 2).mean() / (x**2).mean())


def test_k_quants_refuse_rows_that_are_not_whole_super_blocks() -> None:
    with pytest.raises(ValueError, match="multiple of 256"):
        kquants.quantize(np.zeros((2, 576), np.float32), "Q4_K")


def test_every_gguf_dtype_member_is_a_file_type() -> None:
    assert set(members("GGUFDtype")) == set(filetypes.FILE_TYPES)


def _mix(hidden: int, ffn: int, layers: int, tied: bool) -> dict[tuple[str, str], int]:
    ft = filetypes.FILE_TYPES["q4_k_m"]
    names = [("token_embd.weight", (49152, hidden))]
    if not tied:
        names.append(("output.weight", (49152, hidden)))
    for i in range(layers):
        names += [
            (f"blk.{i}.attn_norm.weight", (hidden,)),
            (f"blk.{i}.attn_q.weight", (hidden, hidden)),
            (f"blk.{i}.attn_v.weight", (hidden // 4, hidden)),
            (f"blk.{i}.ffn_down.weight", (hidden, ffn)),
            (f"blk.{i}.ffn_up.weight", (ffn, hidden)),
        ]
    output = "token_embd.weight" if tied else "output.weight"
    counts: dict[tuple[str, str], int] = {}
    for name, shape in names:
        stem = name.split(".")[2] if name.startswith("blk.") else name
        key = (stem, filetypes.tensor_type(ft, name, shape, layers, output))
        counts[key] = counts.get(key, 0) + 1
    return counts


def test_q4_k_m_is_llama_cpps_mix() -> None:
    # 32 layers of 4096: more bits for layers 0-3, 28-31 and every third between (8 + 8)
    assert _mix(4096, 14336, 32, tied=False) == {
        ("token_embd.weight", "Q4_K"): 1,
        ("output.weight", "Q6_K"): 1,
        ("attn_norm", "F32"): 32,
        ("attn_q", "Q4_K"): 32,
        ("attn_v", "Q6_K"): 16,
        ("attn_v", "Q4_K"): 16,
        ("ffn_down", "Q6_K"): 16,
        ("ffn_down", "Q4_K"): 16,
        ("ffn_up", "Q4_K"): 32,
    }
    # SmolLM2's rows of 576 fall back as llama.cpp's do: Q4_K -> Q5_0, Q6_K -> Q8_0 (tied output)
    assert _mix(576, 1536, 30, tied=True) == {
        ("token_embd.weight", "Q8_0"): 1,
        ("attn_norm", "F32"): 30,
        ("attn_q", "Q5_0"): 30,
        ("attn_v", "Q8_0"): 14,
        ("attn_v", "Q5_0"): 16,
        ("ffn_down", "Q6_K"): 14,
        ("ffn_down", "Q4_K"): 16,
        ("ffn_up", "Q5_0"): 30,
    }


@pytest.mark.parametrize(("dtype", "bound"), [("q8_0", 0.05), ("q4_k_m", 0.3)])
def test_quantized_exports_read_back(tiny_model, tmp_path, dtype: str, bound: float) -> None:
    ids = torch.tensor([[1, 5, 77, 300, 12, 9, 4000, 2]])
    out = export_gguf(tiny_model, tmp_path / f"tiny-{dtype}.gguf", dtype=dtype)
    reader = gguf.GGUFReader(str(out))
    assert reader.fields["general.file_type"].contents() == filetypes.FILE_TYPES[dtype].ftype
    again = load_model(out, "float32", "cpu")
    want = tiny_model.forward(ids)
    relative = float((again.forward(ids) - want).std() / want.std())
    assert 0 < relative < bound  # the random tiny model is sensitive: a loose bound

"""GGML block dequantization in torch against the gguf package's reference dequantizers, on random
block bytes of every type `storage: gguf` keeps and on every tensor of the real SmolLM2 Q4_1."""

from __future__ import annotations

import gguf
import numpy as np
import pytest
import torch

from aner_lang.runtime.io.ggml_blocks import (
    DEQUANTIZERS,
    FP16_FIELDS,
    blocks_finite,
    dequantize_blocks,
)
from aner_lang.runtime.io.gguf import GGUFFile

TYPES = sorted(DEQUANTIZERS)


def _reference(raw: np.ndarray, qtype: str) -> torch.Tensor:
    with np.errstate(invalid="ignore", over="ignore"):
        ref = gguf.quants.dequantize(raw, gguf.GGMLQuantizationType[qtype])
    return torch.from_numpy(np.ascontiguousarray(ref, dtype=np.float32))


def _random_blocks(qtype: str, n: int, seed: int) -> np.ndarray:
    """`n` blocks of random bytes, whose fp16 scales are made finite (random bytes would also be
    NaN or inf there, which both sides turn into the same NaN; finite ones test the arithmetic)."""
    _, type_size = gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType[qtype]]
    raw = np.random.default_rng(seed).integers(0, 256, (n, type_size), dtype=np.uint8)
    for at in FP16_FIELDS[qtype]:
        scales = np.random.default_rng(seed + 1).normal(0, 0.05, n).astype(np.float16)
        raw[:, at : at + 2] = scales.view(np.uint8).reshape(n, 2)
    return raw


@pytest.mark.parametrize("qtype", TYPES)
def test_every_block_type_dequantizes_bit_for_bit_like_the_gguf_package(qtype: str) -> None:
    raw = _random_blocks(qtype, 300, seed=len(qtype))
    got = dequantize_blocks(torch.from_numpy(raw), qtype)
    want = _reference(raw, qtype)
    assert got.dtype == torch.float32 and got.shape == want.shape
    assert torch.equal(got, want)
    assert got.abs().max() > 0  # the bytes were not all zero


@pytest.mark.parametrize("qtype", TYPES)
def test_random_bytes_including_non_finite_scales_agree(qtype: str) -> None:
    """Raw random bytes, scales included: NaN and inf appear in the same places."""
    _, type_size = gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType[qtype]]
    raw = np.random.default_rng(7).integers(0, 256, (200, type_size), dtype=np.uint8)
    got = dequantize_blocks(torch.from_numpy(raw), qtype)
    want = _reference(raw, qtype)
    torch.testing.assert_close(got, want, rtol=0, atol=0, equal_nan=True)
    for i in range(len(raw)):  # finiteness read from the fp16 fields alone, block by block
        assert blocks_finite(torch.from_numpy(raw[i : i + 1]), qtype) == bool(
            torch.isfinite(want[i]).all()
        )


def test_quantized_real_weights_round_trip_through_both_dequantizers(smollm2_path) -> None:
    """Blocks the gguf package quantizes from a real weight (the types it can write)."""
    w = GGUFFile(smollm2_path).tensor("blk.0.ffn_up.weight", (1536, 576)).numpy()
    for qtype in ("Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0"):
        blocks = gguf.quants.quantize(w, gguf.GGMLQuantizationType[qtype])
        raw = blocks.reshape(-1, gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType[qtype]][1])
        assert torch.equal(dequantize_blocks(torch.from_numpy(raw), qtype), _reference(raw, qtype))


def test_every_quantized_tensor_of_the_real_smollm2_matches(smollm2_path) -> None:
    f = GGUFFile(smollm2_path)
    checked = set()
    for t in f.tensors.values():
        if t.qtype.name not in DEQUANTIZERS:
            continue
        _, type_size = gguf.GGML_QUANT_SIZES[t.qtype]
        raw = np.frombuffer(f._map, np.uint8, t.nbytes, t.offset).reshape(-1, type_size)
        raw = raw[: 4096 * 4]  # bounded: the embedding alone is 28 MiB of blocks
        assert torch.equal(
            dequantize_blocks(torch.from_numpy(raw.copy()), t.qtype.name),
            _reference(raw, t.qtype.name),
        ), t.name
        checked.add(t.qtype.name)
    assert checked == {"Q4_1", "Q8_0"}


@pytest.mark.cuda
@pytest.mark.parametrize("qtype", TYPES)
def test_dequantization_on_cuda_matches_the_reference(qtype: str) -> None:
    if not torch.cuda.is_available():
        pytest.skip("no CUDA GPU")
    raw = _random_blocks(qtype, 300, seed=11)
    got = dequantize_blocks(torch.from_numpy(raw).cuda(), qtype)
    assert got.is_cuda
    assert torch.equal(got.cpu(), _reference(raw, qtype))


@pytest.mark.cuda
@pytest.mark.parametrize("qtype", TYPES)
def test_the_fused_kernels_decode_every_type_bit_for_bit(qtype: str) -> None:
    """The NVRTC kernels of `storage: gguf` (ggml.fused) give the reference's fp32 values bit for
    bit, on blocks with finite scales and on raw random bytes (NaN where the reference has NaN);
    16-bit outputs are those values rounded; a row range is those rows."""
    if not torch.cuda.is_available():
        pytest.skip("no CUDA GPU")
    pytest.importorskip("cupy")
    from aner_lang.runtime.ggml import fused
    from aner_lang.runtime.ggml.weight import GGUFWeight

    size, type_size = gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType[qtype]]
    k = 512  # two k-quant super-blocks, 16 small blocks a row
    blocks = 300 * k // size
    for raw in (
        _random_blocks(qtype, blocks, seed=5),
        np.random.default_rng(9).integers(0, 256, (blocks, type_size), dtype=np.uint8),
    ):
        want = _reference(raw, qtype).reshape(300, k)
        w = GGUFWeight(torch.from_numpy(raw.reshape(300, -1)).cuda(), qtype, (300, k))
        got = fused.dequantize(w, torch.float32).cpu()
        torch.testing.assert_close(got, want, rtol=0, atol=0, equal_nan=True)
        for dtype in (torch.float16, torch.bfloat16):
            half = fused.dequantize(w, dtype).cpu()
            torch.testing.assert_close(half, want.to(dtype), rtol=0, atol=0, equal_nan=True)
        rows = fused.dequantize(w, torch.float32, (17, 230)).cpu()
        torch.testing.assert_close(rows, want[17:230], rtol=0, atol=0, equal_nan=True)

"""NF4 + double quantization against the real bitsandbytes package (CPU)."""

from __future__ import annotations

import pytest
import torch

from aner_lang.runtime.nf4.quant import dequantize_nf4, dynamic_map, quantize_nf4

F = pytest.importorskip("bitsandbytes.functional")

SHAPES = [(64, 64), (576, 576), (192, 576), (3, 70), (7, 9), (1, 1)]


def _weight(shape: tuple[int, int], seed: int) -> torch.Tensor:
    w = torch.randn(shape, generator=torch.Generator().manual_seed(seed)) * 0.05
    w.view(-1)[: min(64, w.numel())] = 0.0  # an all-zero block (0x77 bytes, exact zeros)
    return w


def test_dynamic_map_is_bitsandbytes_map() -> None:
    assert torch.equal(dynamic_map(), F.create_dynamic_map())


@pytest.mark.parametrize("shape", SHAPES)
def test_packed_bytes_scales_and_offset_match_bitsandbytes(shape: tuple[int, int]) -> None:
    w = _weight(shape, seed=sum(shape))
    ours = quantize_nf4(w)
    packed, state = F.quantize_4bit(w, blocksize=64, compress_statistics=True, quant_type="nf4")
    assert torch.equal(ours.packed, packed.reshape(-1))
    assert torch.equal(ours.absmax2, state.state2.absmax)
    assert torch.equal(ours.offset, state.offset.reshape(()))
    # bitsandbytes' native CPU library quantizes the absmax codes with a table-driven search
    # that can land one code away from the exact nearest code our (and bnb's own torch
    # backend's) midpoint rule picks; never more than one step, and rarely.
    diff = (ours.qabsmax.int() - state.absmax.int()).abs()
    assert diff.max() <= 1
    assert diff.float().mean() < 0.01


@pytest.mark.parametrize("shape", SHAPES)
def test_dequantize_matches_bitsandbytes_on_the_same_state(shape: tuple[int, int]) -> None:
    w = _weight(shape, seed=7 * sum(shape))
    packed, state = F.quantize_4bit(w, blocksize=64, compress_statistics=True, quant_type="nf4")
    ours = quantize_nf4(w)
    # Feed bitsandbytes' own absmax codes to our dequantizer: the result must be bit-identical.
    theirs = type(ours)(
        ours.packed, state.absmax, ours.absmax2, ours.code2, ours.offset, ours.shape, ours.blocksize
    )
    assert torch.equal(dequantize_nf4(theirs), F.dequantize_4bit(packed, state))


def test_all_zero_block_dequantizes_to_exact_zeros() -> None:
    w = _weight((4, 64), seed=3)
    q = quantize_nf4(w)
    assert torch.all(q.packed[:32] == 0x77)
    assert torch.all(dequantize_nf4(q)[0] == 0.0)


def test_partial_last_block_has_its_own_scale() -> None:
    w = torch.randn(3, 70, generator=torch.Generator().manual_seed(1))
    q = quantize_nf4(w)
    assert q.packed.numel() == 105 and q.qabsmax.numel() == 4
    err = (dequantize_nf4(q) - w).abs().max()
    assert err < 0.2 * w.abs().max()


def test_round_trip_error_is_bounded_by_half_the_largest_code_gap() -> None:
    w = torch.randn(256, 256, generator=torch.Generator().manual_seed(2))
    d = dequantize_nf4(quantize_nf4(w))
    blocks = w.reshape(-1, 64)
    widest_gap = 1.0 - 0.6961928009986877  # between -1 and the next NF4 code
    bound = blocks.abs().max(-1, keepdim=True)[0] * widest_gap / 2 * 1.05
    assert torch.all((d.reshape(-1, 64) - blocks).abs() <= bound)


def test_nf4_linear_hands_out_one_weight_until_its_buffers_change() -> None:
    """Backends keep what they derive from a weight (the fused kernels' argument pack) in the
    NF4Weight, so NF4Linear must give every forward the same one, and a fresh one once a buffer is
    another tensor (moved, replaced), never one that points at the old storage."""
    from aner_lang.runtime.nf4.linear import NF4Linear

    lin = NF4Linear.from_dense(torch.randn(8, 128))
    w = lin.weight_nf4
    w.views["probe"] = object()
    assert lin.weight_nf4 is w
    lin.packed = lin.packed.clone()
    fresh = lin.weight_nf4
    assert fresh is not w and fresh.packed is lin.packed and fresh.views == {}
    assert torch.equal(dequantize_nf4(fresh), dequantize_nf4(w))

"""GGML block formats dequantized in torch, on whatever device the block bytes live.

A block-quantized GGUF tensor is rows of whole blocks (a row's length is a multiple of the block
size, which the GGUF reader checks), each block `type_size` bytes that decode to `block_size`
weights. `dequantize_blocks` turns a `[n_blocks, type_size]` uint8 tensor into `[n_blocks,
block_size]` float32 with the same float32 operations, in the same order, as the `gguf` package's
reference numpy dequantizers, so the two agree bit for bit (tests/runtime/ggml checks every type
on random bytes and on the real SmolLM2 file). Byte layouts are ggml's (ggml-common.h); fp16
scales are read by viewing two little-endian bytes as float16.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

QK_K = 256
"""Weights in a k-quant super-block."""


def _f16(raw: torch.Tensor, at: int) -> torch.Tensor:
    """The fp16 scalar at byte `at` of every block, as float32 `[n, 1]`."""
    return raw[:, at : at + 2].contiguous().view(torch.float16).float()


def _nibbles(qs: torch.Tensor, width: int) -> torch.Tensor:
    """Low then high nibbles of every `width` bytes: `[n, k*width]` bytes -> `[n, k, 2*width]`."""
    q = qs.reshape(qs.shape[0], -1, 1, width)
    out = torch.empty(q.shape[0], q.shape[1], 2, width, dtype=torch.uint8, device=q.device)
    torch.bitwise_and(q, 0x0F, out=out[:, :, :1])
    torch.bitwise_right_shift(q, 4, out=out[:, :, 1:])
    return out.reshape(qs.shape[0], -1, 2 * width)


def _bits(qh: torch.Tensor, shifts: range, mask: int) -> torch.Tensor:
    """Bit fields of `qh` `[n, m]` at `shifts`: `[n, len(shifts), m]` (bit-plane major)."""
    s = torch.tensor(list(shifts), dtype=torch.uint8, device=qh.device).view(1, -1, 1)
    return (qh.unsqueeze(1) >> s) & mask


def _q4_0(raw: torch.Tensor) -> torch.Tensor:
    q = _nibbles(raw[:, 2:], 16).flatten(1).float().sub_(8)
    return q.mul_(_f16(raw, 0))


def _q4_1(raw: torch.Tensor) -> torch.Tensor:
    q = _nibbles(raw[:, 4:], 16).flatten(1).float()
    return q.mul_(_f16(raw, 0)).add_(_f16(raw, 2))


def _five_bit(raw: torch.Tensor, qh_at: int) -> torch.Tensor:
    """The 5-bit values of a Q5_0/Q5_1 block: 4 low bits in nibbles, the fifth in a uint32."""
    low = _nibbles(raw[:, qh_at + 4 :], 16).flatten(1)
    high = _bits(raw[:, qh_at : qh_at + 4], range(8), 1).transpose(1, 2).flatten(1)
    return low | (high << 4)


def _q5_0(raw: torch.Tensor) -> torch.Tensor:
    return _f16(raw, 0) * (_five_bit(raw, 2).to(torch.int8) - 16).float()


def _q5_1(raw: torch.Tensor) -> torch.Tensor:
    return _f16(raw, 0) * _five_bit(raw, 4).float() + _f16(raw, 2)


def _q8_0(raw: torch.Tensor) -> torch.Tensor:
    return raw[:, 2:].contiguous().view(torch.int8).float().mul_(_f16(raw, 0))


def _scale_min_k4(scales: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The eight 6-bit scales and mins packed in a Q4_K/Q5_K block's 12 bytes."""
    s = scales.reshape(-1, 3, 4)
    d, m, md = s[:, 0], s[:, 1], s[:, 2]
    sc = torch.cat((d & 0x3F, (md & 0x0F) | ((d >> 2) & 0x30)), dim=-1)
    mn = torch.cat((m & 0x3F, (md >> 4) | ((m >> 2) & 0x30)), dim=-1)
    return sc, mn


def _k_scaled(raw: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """A Q4_K/Q5_K block from its `[n, 8, 32]` quants: `d*sc*q - dmin*m` per sub-block."""
    n = raw.shape[0]
    sc, mn = _scale_min_k4(raw[:, 4:16])
    d = (_f16(raw, 0) * sc.float()).view(n, -1, 1)
    dm = (_f16(raw, 2) * mn.float()).view(n, -1, 1)
    return (d * q.float() - dm).reshape(n, QK_K)


def _q4_k(raw: torch.Tensor) -> torch.Tensor:
    return _k_scaled(raw, _nibbles(raw[:, 16:], 32).reshape(raw.shape[0], -1, 32))


def _q5_k(raw: torch.Tensor) -> torch.Tensor:
    n = raw.shape[0]
    low = _nibbles(raw[:, 48:], 32).reshape(n, -1, 32)
    high = _bits(raw[:, 16:48], range(8), 1)
    return _k_scaled(raw, low | (high << 4))


def _q6_k(raw: torch.Tensor) -> torch.Tensor:
    n = raw.shape[0]
    ql = _nibbles(raw[:, :128], 64).reshape(n, 2, 2, 64).reshape(n, -1, 32)
    qh = _bits(raw[:, 128:192].reshape(n * 2, 32), range(0, 8, 2), 3).reshape(n, -1, 32)
    q = ((ql | (qh << 4)).to(torch.int8) - 32).reshape(n, QK_K // 16, -1).float()
    scales = raw[:, 192:208].contiguous().view(torch.int8).float()
    d = (_f16(raw, 208) * scales).view(n, QK_K // 16, 1)
    return (d * q).reshape(n, QK_K)


DEQUANTIZERS: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    "Q4_0": _q4_0,
    "Q4_1": _q4_1,
    "Q5_0": _q5_0,
    "Q5_1": _q5_1,
    "Q8_0": _q8_0,
    "Q4_K": _q4_k,
    "Q5_K": _q5_k,
    "Q6_K": _q6_k,
}
"""The block types `storage: gguf` keeps as blocks, by GGML type name."""


FP16_FIELDS: dict[str, tuple[int, ...]] = {
    "Q4_0": (0,),
    "Q4_1": (0, 2),
    "Q5_0": (0,),
    "Q5_1": (0, 2),
    "Q8_0": (0,),
    "Q4_K": (0, 2),
    "Q5_K": (0, 2),
    "Q6_K": (208,),
}
"""Byte offsets of each block type's fp16 scales and mins: every other field is small integers,
and a scale (<= 65504) times one (<= 63 * 63) plus a min cannot overflow float32, so a block
dequantizes to finite values exactly when these fields are finite."""


def blocks_finite(raw: torch.Tensor, qtype: str) -> bool:
    """Whether every weight of `[n_blocks, type_size]` blocks is finite, from their fp16 fields."""
    return all(bool(torch.isfinite(_f16(raw, at)).all()) for at in FP16_FIELDS[qtype])


def dequantize_blocks(raw: torch.Tensor, qtype: str) -> torch.Tensor:
    """`[n_blocks, type_size]` uint8 blocks of GGML type `qtype` -> `[n_blocks, block_size]` fp32."""
    return DEQUANTIZERS[qtype](raw)

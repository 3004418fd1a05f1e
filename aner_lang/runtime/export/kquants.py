"""llama.cpp's Q4_K and Q6_K tensor types, written from fp32 weights with numpy.

The `gguf` package reads these types but does not write them, so they are written here, to the
exact block layouts of ggml (``block_q4_K``, ``block_q6_K`` in ggml-common.h) and with the
scale searches of ggml's reference quantizers (``quantize_row_q4_K_ref``,
``quantize_row_q6_K_ref``, no importance matrix), vectorised over every block of a tensor:

* Q4_K: super-blocks of 256 weights, 144 bytes: fp16 `d` and `dmin`, 12 bytes packing eight
  6-bit sub-block scales and mins, 128 bytes of 4-bit quants. Each sub-block of 32 gets an
  affine fit ``x ~ scale * q - min`` (q in 0..15), chosen among 21 candidate scales by weighted
  squared error (weights ``rms(x) + |x|``); the scales and mins are then quantized to 6 bits
  against the largest of each, and the quants recomputed with the rounded values.
* Q6_K: super-blocks of 256 weights, 210 bytes: 128 bytes of low 4 bits, 64 bytes of high 2 bits,
  sixteen int8 sub-block scales, fp16 `d`. Each sub-block of 16 gets a symmetric fit
  ``x ~ scale * q`` (q in -32..31) chosen among 19 candidates by ``x^2``-weighted error.

Rounding is to the nearest integer with ties to even, as ggml's ``nearest_int``. A file written
here is read back by `gguf.quants.dequantize` and by llama.cpp itself (tests/runtime/export).
"""

from __future__ import annotations

import numpy as np

QK_K = 256
Q4_K_BYTES = 144
Q6_K_BYTES = 210
_CHUNK_BLOCKS = 16384
"""Super-blocks quantized at a time, bounding the temporaries of a large tensor (~100 MB)."""


def _fp16_round(x: np.ndarray) -> np.ndarray:
    """`x` stored as fp16 and read back (what dequantization will use)."""
    return x.astype(np.float16).astype(np.float32)


def _affine_fit(
    x: np.ndarray, w: np.ndarray, nmax: int, rmin: float, rdelta: float, nstep: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """ggml's ``make_qkx2_quants`` over the last axis: (scale, min as a positive offset, quants).

    `x`, `w`: [..., n] values and error weights. The fit is ``x ~ scale * q - min`` with
    ``min >= 0`` (the data minimum, or 0 when every value is positive)."""
    lo = np.minimum(x.min(axis=-1), 0.0)
    hi = x.max(axis=-1)
    span = hi - lo
    flat = span == 0
    safe = np.where(flat, 1.0, span).astype(np.float32)
    sum_w = w.sum(axis=-1)
    sum_x = (w * x).sum(axis=-1)

    iscale: np.ndarray = nmax / safe
    quants = np.clip(np.rint(iscale[..., None] * (x - lo[..., None])), 0, nmax)
    scale = 1.0 / iscale
    offset = lo.copy()
    best = (w * (scale[..., None] * quants + offset[..., None] - x) ** 2).sum(axis=-1)
    for step in range(nstep + 1):
        iscale = (rmin + rdelta * step + nmax) / safe
        cand = np.clip(np.rint(iscale[..., None] * (x - lo[..., None])), 0, nmax)
        sum_l = (w * cand).sum(axis=-1)
        sum_l2 = (w * cand * cand).sum(axis=-1)
        sum_xl = (w * cand * x).sum(axis=-1)
        det = sum_w * sum_l2 - sum_l * sum_l
        ok = det > 0
        det = np.where(ok, det, 1.0)
        this_scale = (sum_w * sum_xl - sum_x * sum_l) / det
        this_min = (sum_l2 * sum_x - sum_l * sum_xl) / det
        positive = this_min > 0
        this_scale = np.where(positive, sum_xl / np.where(sum_l2 > 0, sum_l2, 1.0), this_scale)
        this_min = np.where(positive, 0.0, this_min)
        err = (w * (this_scale[..., None] * cand + this_min[..., None] - x) ** 2).sum(axis=-1)
        better = ok & (err < best)
        quants = np.where(better[..., None], cand, quants)
        best = np.where(better, err, best)
        scale = np.where(better, this_scale, scale)
        offset = np.where(better, this_min, offset)
    scale = np.where(flat, 0.0, scale)
    quants = np.where(flat[..., None], 0.0, quants)
    return scale.astype(np.float32), (-offset).astype(np.float32), quants


def _q4_k_blocks(x: np.ndarray) -> np.ndarray:
    """[nb, 256] fp32 -> [nb, 144] uint8 Q4_K blocks."""
    nb = x.shape[0]
    sub = x.reshape(nb, 8, 32)
    av = np.sqrt((sub * sub).mean(axis=-1, keepdims=True))
    scales, mins, quants = _affine_fit(sub, av + np.abs(sub), 15, -1.0, 0.1, 20)
    max_scale, max_min = scales.max(axis=-1), mins.max(axis=-1)
    inv_scale = np.where(max_scale > 0, 63.0 / np.where(max_scale > 0, max_scale, 1.0), 0.0)
    inv_min = np.where(max_min > 0, 63.0 / np.where(max_min > 0, max_min, 1.0), 0.0)
    ls = np.minimum(63, np.rint(inv_scale[:, None] * scales)).astype(np.uint8)
    lm = np.minimum(63, np.rint(inv_min[:, None] * mins)).astype(np.uint8)
    d = (max_scale / 63.0).astype(np.float16)
    dmin = (max_min / 63.0).astype(np.float16)

    sub_d = d.astype(np.float32)[:, None] * ls
    sub_m = dmin.astype(np.float32)[:, None] * lm
    requant = np.clip(
        np.rint((sub + sub_m[..., None]) / np.where(sub_d == 0, 1.0, sub_d)[..., None]), 0, 15
    )
    quants = np.where((sub_d == 0)[..., None], quants, requant).astype(np.uint8)

    packed = np.zeros((nb, 12), dtype=np.uint8)
    packed[:, 0:4] = ls[:, 0:4] | ((ls[:, 4:8] >> 4) << 6)
    packed[:, 4:8] = lm[:, 0:4] | ((lm[:, 4:8] >> 4) << 6)
    packed[:, 8:12] = (ls[:, 4:8] & 0x0F) | ((lm[:, 4:8] & 0x0F) << 4)
    pairs = quants.reshape(nb, 4, 2, 32)  # 64 weights a row: low nibble first 32, high the next
    qs = (pairs[:, :, 0, :] | (pairs[:, :, 1, :] << 4)).reshape(nb, 128)
    return np.concatenate(
        [d.view(np.uint8).reshape(nb, 2), dmin.view(np.uint8).reshape(nb, 2), packed, qs], axis=1
    )


def _symmetric_fit(x: np.ndarray, nmax: int) -> tuple[np.ndarray, np.ndarray]:
    """ggml's ``make_qx_quants`` with ``rmse_type=1`` over the last axis: (scale, quants in
    0..2*nmax-1, i.e. offset by nmax)."""
    amax_at = np.abs(x).argmax(axis=-1)
    peak = np.take_along_axis(x, amax_at[..., None], axis=-1)[..., 0]
    zero = np.abs(peak) < 1e-15
    peak = np.where(zero, 1.0, peak)
    w = x * x

    def attempt(iscale: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        q = np.clip(np.rint(iscale[..., None] * x), -nmax, nmax - 1)
        return q, (w * x * q).sum(axis=-1), (w * q * q).sum(axis=-1)

    quants, sumlx, suml2 = attempt(-nmax / peak)
    scale = np.where(suml2 > 0, sumlx / np.where(suml2 > 0, suml2, 1.0), 0.0)
    best = scale * sumlx
    for step in range(-9, 10):
        if step == 0:
            continue
        cand, slx, sl2 = attempt(-(nmax + 0.1 * step) / peak)
        better = (sl2 > 0) & (slx * slx > best * sl2)
        quants = np.where(better[..., None], cand, quants)
        scale = np.where(better, slx / np.where(sl2 > 0, sl2, 1.0), scale)
        best = np.where(better, scale * slx, best)
    scale = np.where(zero, 0.0, scale)
    quants = np.where(zero[..., None], 0.0, quants)
    return scale.astype(np.float32), (quants + nmax)


def _q6_k_blocks(x: np.ndarray) -> np.ndarray:
    """[nb, 256] fp32 -> [nb, 210] uint8 Q6_K blocks."""
    nb = x.shape[0]
    sub = x.reshape(nb, 16, 16)
    scales, quants = _symmetric_fit(sub, 32)
    peak_at = np.abs(scales).argmax(axis=-1)
    max_scale = np.take_along_axis(scales, peak_at[:, None], axis=-1)[:, 0]
    empty = np.abs(max_scale) < 1e-15
    iscale = np.where(empty, 0.0, -128.0 / np.where(empty, 1.0, max_scale))
    d = np.where(empty, 0.0, 1.0 / np.where(empty, 1.0, iscale)).astype(np.float16)
    sc = np.minimum(127, np.rint(iscale[:, None] * scales)).astype(np.int8)
    sub_d = d.astype(np.float32)[:, None] * sc
    requant = np.clip(np.rint(sub / np.where(sub_d == 0, 1.0, sub_d)[..., None]), -32, 31) + 32
    levels = (
        np.where((sub_d == 0)[..., None], quants, requant).astype(np.uint8).reshape(nb, 2, 4, 32)
    )
    levels = np.where(empty[:, None, None, None], 0, levels).astype(np.uint8)
    sc = np.where(empty[:, None], 0, sc).astype(np.int8)
    low, high = levels & 0x0F, levels >> 4
    ql = np.concatenate(
        [low[:, :, 0] | (low[:, :, 2] << 4), low[:, :, 1] | (low[:, :, 3] << 4)], axis=-1
    )
    qh = high[:, :, 0] | (high[:, :, 1] << 2) | (high[:, :, 2] << 4) | (high[:, :, 3] << 6)
    return np.concatenate(
        [
            ql.reshape(nb, 128),
            qh.reshape(nb, 64),
            sc.view(np.uint8),
            d.view(np.uint8).reshape(nb, 2),
        ],
        axis=1,
    )


_WRITERS = {"Q4_K": (_q4_k_blocks, Q4_K_BYTES), "Q6_K": (_q6_k_blocks, Q6_K_BYTES)}


def quantize(weights: np.ndarray, kind: str) -> np.ndarray:
    """`weights` [rows, cols] (cols a multiple of 256) as `kind` ("Q4_K" or "Q6_K") blocks:
    uint8 [rows, cols / 256 * block bytes], the byte layout GGUF stores."""
    blocks_of, block_bytes = _WRITERS[kind]
    rows, cols = weights.shape
    if cols % QK_K:
        raise ValueError(f"{kind} needs rows of a multiple of {QK_K} values, got {cols}")
    flat = np.ascontiguousarray(weights, dtype=np.float32).reshape(-1, QK_K)
    out = np.empty((flat.shape[0], block_bytes), dtype=np.uint8)
    for start in range(0, flat.shape[0], _CHUNK_BLOCKS):
        out[start : start + _CHUNK_BLOCKS] = blocks_of(flat[start : start + _CHUNK_BLOCKS])
    return out.reshape(rows, cols // QK_K * block_bytes)

"""NF4 with double quantization, byte-compatible with bitsandbytes 0.50 on CPU.

Why our own code rather than calling bitsandbytes: bitsandbytes is a 43 MB CUDA-centric wheel that
is optional for Aner (it is only a dev dependency we test against), and the quantizer is a few
tensor operations. The arithmetic below deliberately follows bitsandbytes' CPU/default backend
operation for operation (reciprocal-then-multiply scaling, clamping, `bucketize` on fp32
midpoints, `absmax.mean()` offset) so that the packed bytes, absmax codes, 256-block scales and
offset are identical, which `tests/nf4/test_nf4_quant.py` checks against the real package.

Layout (research/training.md section 1): the weight `[out, in]` is flattened row-major and cut into
blocks of `blocksize` (64) elements, the last block possibly partial. Each element becomes a 4-bit
index into the NF4 code; element 2j is the high nibble of byte j. The per-block absmax values are
quantized again ("double quantization"): minus their mean (`offset`), in blocks of 256, with
bitsandbytes' signed 8-bit dynamic map (`code2`), keeping one fp32 scale (`absmax2`) per 256
blocks.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cache

import torch

NF4_CODE_VALUES: tuple[float, ...] = (
    -1.0,
    -0.6961928009986877,
    -0.5250730514526367,
    -0.39491748809814453,
    -0.28444138169288635,
    -0.18477343022823334,
    -0.09105003625154495,
    0.0,
    0.07958029955625534,
    0.16093020141124725,
    0.24611230194568634,
    0.33791524171829224,
    0.44070982933044434,
    0.5626170039176941,
    0.7229568362236023,
    1.0,
)
"""The 16 NF4 values (bitsandbytes' `get_4bit_type("nf4")`), embedded rather than regenerated."""

NESTED_BLOCKSIZE = 256
_VALID_BLOCKSIZES = (32, 64, 128, 256, 512, 1024, 2048, 4096)


_CPU = torch.device("cpu")


@cache
def nf4_code(device: torch.device = _CPU) -> torch.Tensor:
    """The NF4 code table as an fp32 tensor on `device` (cached: every layer shares it)."""
    return torch.tensor(NF4_CODE_VALUES, dtype=torch.float32, device=device)


@cache
def dynamic_map(device: torch.device = _CPU) -> torch.Tensor:
    """The signed 8-bit dynamic map bitsandbytes uses for the absmax statistics (256 fp32 values).

    Dettmers' dynamic data type (arXiv 1511.04561) with 7 exponent bits: for exponent level i
    (0..6), 2^i + 1 evenly spaced fractions in [0.1, 1] give 2^i bucket midpoints, scaled by
    10^(i-6), each with both signs; then 0 and 1.0 complete the 256 entries. Built in fp32 exactly
    as bitsandbytes builds it (linspace in fp32, midpoints in fp32, products in Python floats).
    """
    values: list[float] = [0.0, 1.0]
    for level in range(7):
        edges = torch.linspace(0.1, 1, 2**level + 1, dtype=torch.float32)
        mids = (edges[:-1] + edges[1:]) / 2.0
        scaled = ((10 ** (level - 6)) * mids).tolist()
        values += scaled + (-(10 ** (level - 6)) * mids).tolist()
    values.sort()
    return torch.tensor(values, dtype=torch.float32, device=device)


@dataclass(frozen=True)
class NF4Weight:
    """One double-quantized NF4 weight: what is stored for a frozen `[out, in]` matrix.

    `packed` uint8 [ceil(n/2)] (element 2j in the high nibble); `qabsmax` uint8 [blocks];
    `absmax2` fp32 [ceil(blocks/256)]; `code2` fp32 [256] (the shared dynamic map); `offset` fp32
    0-d tensor; `shape` the original (out, in).
    """

    packed: torch.Tensor
    qabsmax: torch.Tensor
    absmax2: torch.Tensor
    code2: torch.Tensor
    offset: torch.Tensor
    shape: tuple[int, int]
    blocksize: int = 64
    # Forms of this weight a backend derives once and reuses (the fused kernels' argument pack),
    # keyed by backend name; NF4Linear hands every forward the same NF4Weight while its buffers stay.
    views: dict = field(default_factory=dict, compare=False, repr=False)

    @property
    def numel(self) -> int:
        return self.shape[0] * self.shape[1]

    @property
    def num_blocks(self) -> int:
        return -(-self.numel // self.blocksize)

    def packed_nbytes(self) -> int:
        """Bytes of this weight's own storage; the shared code tables are not counted."""
        return (
            self.packed.numel()
            + self.qabsmax.numel()
            + 4 * self.absmax2.numel()
            + 4 * self.offset.numel()
        )

    def to(self, device: torch.device | str) -> NF4Weight:
        return NF4Weight(
            self.packed.to(device),
            self.qabsmax.to(device),
            self.absmax2.to(device),
            self.code2.to(device),
            self.offset.to(device),
            self.shape,
            self.blocksize,
        )


def _blockwise_absmax_and_scaled(
    flat: torch.Tensor, blocksize: int, clamp_tail: bool
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-block absmax and the values scaled into [-1, 1], bitsandbytes' arithmetic exactly.

    bitsandbytes' 4-bit quantizer stores a partial last block's absmax clamped to 1e-38, its
    8-bit (statistics) quantizer stores it unclamped; `clamp_tail` says which one this is.
    """
    n = flat.numel()
    rem = n % blocksize
    full = n - rem
    blocks = flat[:full].reshape(-1, blocksize)
    absmax = blocks.abs().max(dim=-1)[0]
    scaled = torch.clamp(blocks * (1.0 / absmax.clamp(min=1e-38).view(-1, 1)), -1, 1).reshape(-1)
    if rem:
        tail_max = flat[full:].abs().max().clamp(min=1e-38)
        stored = tail_max if clamp_tail else flat[full:].abs().max()
        absmax = torch.cat([absmax, stored.unsqueeze(0)])
        scaled = torch.cat([scaled, torch.clamp(flat[full:] / tail_max, -1, 1)])
    return absmax, scaled


def _nearest_code(scaled: torch.Tensor, code: torch.Tensor) -> torch.Tensor:
    """Index of the code entry nearest each value; a value on a midpoint takes the lower entry."""
    midpoints = (code[:-1] + code[1:]) / 2
    return torch.bucketize(scaled, midpoints, out_int32=True).to(torch.uint8)


def quantize_nf4(weight: torch.Tensor, blocksize: int = 64, double_quant: bool = True) -> NF4Weight:
    """Quantize a 2-D float weight to NF4 with double-quantized absmax statistics."""
    if not double_quant:
        raise ValueError("Aner stores NF4 with double quantization only (double_quant=True)")
    if blocksize not in _VALID_BLOCKSIZES:
        raise ValueError(f"invalid NF4 blocksize {blocksize}; valid: {_VALID_BLOCKSIZES}")
    if weight.dim() != 2:
        raise ValueError(f"quantize_nf4 expects a 2-D weight, got shape {tuple(weight.shape)}")
    device = weight.device
    flat = weight.detach().reshape(-1).float()
    absmax, scaled = _blockwise_absmax_and_scaled(flat, blocksize, clamp_tail=True)
    if scaled.numel() % 2:
        scaled = torch.nn.functional.pad(scaled, (0, 1))
    nibbles = _nearest_code(scaled, nf4_code(device))
    packed = (nibbles[::2] << 4) | nibbles[1::2]

    offset = absmax.mean()
    absmax2, scaled2 = _blockwise_absmax_and_scaled(
        absmax - offset, NESTED_BLOCKSIZE, clamp_tail=False
    )
    code2 = dynamic_map(device)
    qabsmax = _nearest_code(scaled2, code2)
    # A statistics block that is all zero (e.g. a tensor of a single 64-block, whose absmax equals
    # the mean) scales 0/0 in bitsandbytes' native code, which then stores code 0; the value
    # dequantizes to `offset` either way, and matching the byte keeps files identical.
    empty = (absmax2 == 0).repeat_interleave(NESTED_BLOCKSIZE)[: qabsmax.numel()]
    qabsmax = torch.where(empty, torch.zeros_like(qabsmax), qabsmax)
    return NF4Weight(
        packed.contiguous(),
        qabsmax.contiguous(),
        absmax2.contiguous(),
        code2,
        offset.reshape(()),
        (int(weight.shape[0]), int(weight.shape[1])),
        blocksize,
    )


def block_absmax(w: NF4Weight, first: int = 0, last: int | None = None) -> torch.Tensor:
    """The dequantized absmax of blocks [first, last): code2[q] * absmax2[block // 256] + offset."""
    last = w.num_blocks if last is None else last
    q = w.qabsmax[first:last].long()
    scale_idx = torch.arange(first, last, device=q.device) // NESTED_BLOCKSIZE
    return w.code2[q] * w.absmax2[scale_idx] + w.offset


@cache
def _byte_values(device: torch.device) -> torch.Tensor:
    """[256, 2] fp32: the two NF4 values (high nibble, low nibble) of every packed byte.

    One table lookup per byte instead of shifting, masking and looking up each nibble: the
    dequantization is bandwidth-bound on the CPU and this halves its time.
    """
    code, byte = nf4_code(device), torch.arange(256, device=device)
    return torch.stack((code[byte >> 4], code[byte & 0xF]), dim=1)


@cache
def byte_table(device: torch.device = _CPU) -> torch.Tensor:
    """[256, 2] fp32: the two NF4 values (high nibble, low nibble) each packed byte stands for."""
    code = nf4_code(device)
    byte = torch.arange(256, device=device)
    return torch.stack((code[byte >> 4], code[byte & 0xF]), dim=-1)


def dequantize_range(
    w: NF4Weight, start: int, stop: int, out: torch.Tensor | None = None
) -> torch.Tensor:
    """Dequantize flat elements [start, stop) into fp32 (into `out` when given).

    `start` must be a multiple of the blocksize (tiles are block-aligned); `stop` may end anywhere.
    This is the one dequantization routine: whole-tensor, tiles and embedding rows all use it.
    One table lookup per byte gives both values; the scale is broadcast per block.
    """
    if start % w.blocksize:
        raise ValueError("dequantize_range needs a block-aligned start")
    count = stop - start
    first_block, last_block = start // w.blocksize, -(-stop // w.blocksize)
    raw = w.packed[start // 2 : -(-stop // 2)]
    values = byte_table(raw.device)[raw.long()].reshape(-1)
    padded = (last_block - first_block) * w.blocksize
    if values.numel() < padded:  # a partial last block: pad to whole blocks, then trim
        values = torch.nn.functional.pad(values, (0, padded - values.numel()))
    scaled = (
        values[:padded]
        .view(-1, w.blocksize)
        .mul_(block_absmax(w, first_block, last_block)[:, None])
        .view(-1)[:count]
    )
    if out is None:
        return scaled
    return out.copy_(scaled)


def dequantize_nf4(w: NF4Weight, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """The whole dense weight `[out, in]`, computed in fp32 then cast to `dtype` (as bnb does)."""
    return dequantize_range(w, 0, w.numel).reshape(w.shape).to(dtype)

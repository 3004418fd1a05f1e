"""The host_tiled NF4 matmul: dequantize bounded row tiles into a reused buffer, then matmul.

Why tiles: the dense weight of a 49152x576 embedding is 113 MB in fp32; dequantizing it whole for
every forward would double the memory NF4 saves. A tile of `tile_bytes` (8 MiB by default) is
dequantized at a time into a scratch buffer that is reused across tiles and layers, so peak extra
memory is one tile whatever the model. Pure torch: runs on CPU and on CUDA tensors alike.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from math import gcd

import torch

from aner_lang.runtime.model.precision import compute_dtype, matmul
from aner_lang.runtime.nf4.quant import NESTED_BLOCKSIZE, NF4Weight, dequantize_range, nf4_code

DEFAULT_TILE_BYTES = 8 * 1024 * 1024

Tiles = Iterable[tuple[int, int, torch.Tensor]]
"""(first_row, last_row, dense tile [rows, in]) covering a weight, dequantized one at a time."""

_scratch: dict[tuple[torch.device, torch.dtype], torch.Tensor] = {}


def reused_buffers() -> list[torch.Tensor]:
    """The reused buffers as they are now (a CUDA graph recorded against them keeps them)."""
    return list(_scratch.values())


def _scratch_buffer(numel: int, device: torch.device, dtype: torch.dtype) -> torch.Tensor:
    """A flat buffer of at least `numel` elements, kept per (device, dtype) and reused."""
    buf = _scratch.get((device, dtype))
    if buf is None or buf.numel() < numel:
        buf = torch.empty(numel, device=device, dtype=dtype)
        _scratch[(device, dtype)] = buf
    return buf[:numel]


def tile_rows(w: NF4Weight, tile_bytes: int) -> int:
    """Rows per tile: as many as fit the budget in fp32, a whole number of blocks, at least one step."""
    n_out, n_in = w.shape
    step = w.blocksize // gcd(n_in, w.blocksize)  # rows whose elements start on a block boundary
    rows = max(step, (tile_bytes // (4 * n_in)) // step * step)
    return min(rows, n_out)


def _tiles(w: NF4Weight, dtype: torch.dtype, tile_bytes: int) -> Tiles:
    """Yield (first_row, last_row, dense tile [rows, in] in `dtype`) over the whole weight."""
    n_out, n_in = w.shape
    rows = tile_rows(w, tile_bytes)
    device = w.packed.device
    fp32 = _scratch_buffer(rows * n_in, device, torch.float32)
    cast = None if dtype == torch.float32 else _scratch_buffer(rows * n_in, device, dtype)
    for r0 in range(0, n_out, rows):
        r1 = min(n_out, r0 + rows)
        count = (r1 - r0) * n_in
        tile = dequantize_range(w, r0 * n_in, r1 * n_in, out=fp32[:count])
        if cast is not None:
            tile = cast[:count].copy_(tile)
        yield r0, r1, tile.view(r1 - r0, n_in)


def linear(x: torch.Tensor, w: NF4Weight, tile_bytes: int = DEFAULT_TILE_BYTES) -> torch.Tensor:
    """y = x @ W^T for x [..., in] in the compute dtype (autocast's, else x's), returned in x's
    dtype; W is never materialized whole."""
    return tiled_linear(x, w.shape, lambda dtype: _tiles(w, dtype, tile_bytes))


def grad_input(
    grad_y: torch.Tensor, w: NF4Weight, tile_bytes: int = DEFAULT_TILE_BYTES
) -> torch.Tensor:
    """dL/dx = grad_y @ W for grad_y [..., out] (see `tiled_grad_input`)."""
    return tiled_grad_input(grad_y, w.shape, lambda dtype: _tiles(w, dtype, tile_bytes))


def tiled_linear(
    x: torch.Tensor, shape: tuple[int, int], tiles: Callable[[torch.dtype], Tiles]
) -> torch.Tensor:
    """y = x @ W^T for any packed W of `shape` (out, in) whose `tiles(dtype)` cover it: computed
    in the compute dtype (autocast's, else x's), returned in x's dtype."""
    dtype = compute_dtype(x)
    x2 = x.reshape(-1, x.shape[-1]).to(dtype)
    y = torch.empty(x2.shape[0], shape[0], device=x.device, dtype=x.dtype)
    for r0, r1, tile in tiles(dtype):
        y[:, r0:r1] = matmul(x2, tile.t(), x.dtype)
    return y.reshape(*x.shape[:-1], shape[0])


def tiled_grad_input(
    grad_y: torch.Tensor, shape: tuple[int, int], tiles: Callable[[torch.dtype], Tiles]
) -> torch.Tensor:
    """dL/dx = grad_y @ W, accumulated tile by tile in grad_y's dtype (the autograd Function runs
    it outside autocast)."""
    g2 = grad_y.reshape(-1, grad_y.shape[-1])
    gx = torch.zeros(g2.shape[0], shape[1], device=grad_y.device, dtype=grad_y.dtype)
    for r0, r1, tile in tiles(grad_y.dtype):
        gx.addmm_(g2[:, r0:r1], tile)
    return gx.reshape(*grad_y.shape[:-1], shape[1])


def rows(w: NF4Weight, ids: torch.Tensor) -> torch.Tensor:
    """Embedding lookup: dequantize only the rows `ids` (fp32), shape ids.shape + (in,).

    Rows that are whole blocks (every model's hidden size) are gathered straight from `ids` on
    the device: no host round trip, so a training step stays one CUDA graph. Otherwise rows start
    mid-block and each distinct one is dequantized from its block boundary."""
    n_in = w.shape[1]
    if n_in % w.blocksize == 0:
        return _aligned_rows(w, ids.reshape(-1)).reshape(*ids.shape, n_in)
    unique, inverse = torch.unique(ids.reshape(-1), return_inverse=True)
    parts = []
    for r in unique.tolist():
        start = (r * n_in) // w.blocksize * w.blocksize
        parts.append(dequantize_range(w, start, (r + 1) * n_in)[r * n_in - start :])
    return torch.stack(parts)[inverse].reshape(*ids.shape, n_in)


def _aligned_rows(w: NF4Weight, row_ids: torch.Tensor) -> torch.Tensor:
    """Rows of a weight whose rows are whole blocks, gathered and dequantized in one pass."""
    n_out, n_in = w.shape
    per_row = n_in // w.blocksize
    raw = w.packed.view(n_out, n_in // 2)[row_ids]
    nibbles = torch.stack((raw >> 4, raw & 0xF), dim=-1).reshape(len(row_ids), n_in).long()
    blocks = row_ids[:, None] * per_row + torch.arange(per_row, device=row_ids.device)
    scales = (
        w.code2[w.qabsmax.view(n_out, per_row)[row_ids].long()]
        * w.absmax2[blocks // NESTED_BLOCKSIZE]
        + w.offset
    )
    values = nf4_code(raw.device)[nibbles].view(len(row_ids), per_row, w.blocksize)
    return (values * scales[..., None]).reshape(len(row_ids), n_in)

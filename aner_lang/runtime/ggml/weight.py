"""`GGUFWeight`: one GGUF tensor's quantized blocks, rows in Hugging Face order, on a device.

A row of a block-quantized tensor is a whole number of blocks (blocks run along the input
dimension), so the weight is a `[out_features, row_bytes]` uint8 tensor: row r holds the blocks
of output row r. Permuting output rows therefore permutes whole byte rows and never splits a
block, which is how the loader undoes llama.cpp's q/k row permutation (`io.gguf.unpermute_rows`)
without touching a value: the base then has the Hugging Face layout every adapter, merge and
exporter expects, and `export_lora_gguf` permutes an adapter's B back as it does for any base.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import torch

from aner_lang.runtime.io.ggml_blocks import blocks_finite, dequantize_blocks


@dataclass(frozen=True)
class GGUFWeight:
    """`raw` `[out, row_bytes]` uint8 blocks of GGML type `qtype` for an `[out, in]` weight."""

    raw: torch.Tensor
    qtype: str
    shape: tuple[int, int]

    def rows(self, r0: int, r1: int) -> torch.Tensor:
        """Rows r0..r1 dequantized: `[r1 - r0, in]` float32."""
        return self.take(self.raw[r0:r1])

    def take(self, raw_rows: torch.Tensor) -> torch.Tensor:
        """Byte rows of this weight (a slice or a gather of `raw`) dequantized to float32."""
        blocks = raw_rows.reshape(raw_rows.shape[0] * self._blocks_per_row(), -1)
        return dequantize_blocks(blocks, self.qtype).reshape(raw_rows.shape[0], self.shape[1])

    def finite(self) -> bool:
        """Whether every weight is finite (`blocks.blocks_finite`: no dequantization needed)."""
        return blocks_finite(
            self.raw.reshape(-1, self.raw.shape[1] // self._blocks_per_row()), self.qtype
        )

    def _blocks_per_row(self) -> int:
        return self.shape[1] // block_size(self.qtype)

    def tile_rows(self, tile_bytes: int) -> int:
        """Rows per tile: as many as fit `tile_bytes` of fp32, at least one."""
        return max(1, min(self.shape[0], tile_bytes // (4 * self.shape[1])))

    def tiles(self, dtype: torch.dtype, tile_bytes: int) -> Iterator[tuple[int, int, torch.Tensor]]:
        """(first_row, last_row, dense `[rows, in]` tile in `dtype`) over the whole weight."""
        step = self.tile_rows(tile_bytes)
        for r0 in range(0, self.shape[0], step):
            r1 = min(self.shape[0], r0 + step)
            yield r0, r1, self.rows(r0, r1).to(dtype)

    def nbytes(self) -> int:
        return self.raw.numel()


def block_size(qtype: str) -> int:
    """Weights per block of GGML type `qtype` (the gguf package's table)."""
    import gguf

    return int(gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType[qtype]][0])

"""How much the memory-bounded computations take at a time: the chunked loss
(`loss.head_loss_sum`) and the NF4 many-token path's dequantized weight (`nf4.fused.ops`).
Imports nothing, so `aner plan` reads them without torch."""

from __future__ import annotations

CHUNK_BYTES = 256 << 20
"""fp32 logits of one chunk of `head_loss_sum` (the chunk's transient memory is about twice it)."""

DEQUANT_MAX_ELEMENTS = 1 << 26
"""The most weight elements the NF4 many-token path dequantizes at once (128 MiB in a 16-bit
dtype). A decoder layer's projections fit whole (Llama-3-8B's largest has 58.7M elements); a
larger weight, such as the lm_head of a 128k vocabulary (525M elements, 1 GiB in bf16), goes
through in row slices, so the reused buffer stays the size of a layer's projection."""


def row_slices(out_features: int, in_features: int) -> list[tuple[int, int]]:
    """Row ranges `[r0, r1)` of an `[out_features, in_features]` weight, each of at most
    `DEQUANT_MAX_ELEMENTS` elements (one range where the weight fits whole)."""
    rows = max(1, DEQUANT_MAX_ELEMENTS // in_features)
    return [(r, min(r + rows, out_features)) for r in range(0, out_features, rows)]

"""How much the memory-bounded computations take at a time: the chunked loss
(`loss.head_loss_sum`), the NF4 many-token path's dequantized weight (`nf4.fused.ops`) and a
checkpointed MLP's token tiles (`activations.run_tiled`).
Imports nothing, so `aner plan` reads them without torch."""

from __future__ import annotations

CHUNK_BYTES = 256 << 20
"""fp32 logits of one chunk of `head_loss_sum` (the chunk's transient memory is about twice it)."""

DEQUANT_MAX_ELEMENTS = 1 << 26
"""The most weight elements the NF4 many-token path dequantizes at once (128 MiB in a 16-bit
dtype). A decoder layer's projections fit whole (Llama-3-8B's largest has 58.7M elements); a
larger weight, such as the lm_head of a 128k vocabulary (525M elements, 1 GiB in bf16), goes
through in row slices, so the reused buffer stays the size of a layer's projection."""


MLP_TILE_BYTES = 256 << 20
"""The most bytes one of a checkpointed MLP's `[tokens, intermediate]` activations (gate, up,
their product) takes: a longer micro-batch runs the MLP a tile of tokens at a time
(`mlp_tile_tokens`). Llama-3-8B in bf16 tiles from 9,362 tokens, so contexts up to 8192 run
whole; SmolLM2 from 87,381."""


def mlp_tile_tokens(intermediate: int, element_bytes: int) -> int:
    """Tokens per tile of a checkpointed MLP of width `intermediate` computing in elements of
    `element_bytes` bytes (`MLP_TILE_BYTES`)."""
    return max(1, MLP_TILE_BYTES // (intermediate * element_bytes))


def row_slices(out_features: int, in_features: int) -> list[tuple[int, int]]:
    """Row ranges `[r0, r1)` of an `[out_features, in_features]` weight, each of at most
    `DEQUANT_MAX_ELEMENTS` elements (one range where the weight fits whole)."""
    rows = max(1, DEQUANT_MAX_ELEMENTS // in_features)
    return [(r, min(r + rows, out_features)) for r in range(0, out_features, rows)]

"""How much of a batch the chunked loss (`loss.head_loss_sum`) computes at a time; imports nothing,
so `aner plan` reads it without torch."""

from __future__ import annotations

CHUNK_BYTES = 256 << 20
"""fp32 logits of one chunk of `head_loss_sum` (the chunk's transient memory is about twice it)."""

"""Attention inside the examples of packed rows: a token sees the earlier tokens of its own
example only (those since the last position 0 of its row).

Two forms of the same rule, chosen per forward by `packed_attention`:

* `segment_mask`: a `[B, 1, T, T]` mask for one attention call over whole rows. Its size grows
  with the square of the row, and no fused kernel takes both a mask and grouped key/value heads
  (flash takes no mask, the memory-efficient kernel no grouped heads:
  benchmarks/results/h200_attention_backends.log), so a long packed row would be attended over
  `[B, heads, T, T]` scores.
* `Segments`: the examples' token ranges, read on the host, and one causal attention call per
  example, which every fused kernel takes; a run of one-token examples (the padding of a row:
  `tasks.batches.collate`) is its values, each token seeing only itself.

Rule: micro-batches of `SEGMENTS_FROM_TOKENS` tokens or more are attended by `Segments`, as long
as no CUDA graph is being recorded (reading the ranges is a host round trip); shorter ones by
the mask, which a CUDA graph records. The two give the same attention up to the order of float
sums.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from dataclasses import dataclass

import torch

SEGMENTS_FROM_TOKENS = 8192
"""Micro-batches of this many tokens or more attend per example: where the trainer runs a step
eagerly anyway (`train.footprint.EAGER_FROM_TOKENS`) and a mask would take 64 MiB or more."""

Attend = Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]
"""Causal attention over one example's `[1, heads, n, head_dim]` queries and `[1, kv_heads, n,
head_dim]` keys and values."""


def segment_mask(positions: torch.Tensor) -> torch.Tensor:
    """`[B, 1, T, T]`: query i sees key j when j <= i and no position 0 lies in (j, i] (the same
    example of a packed row)."""
    segment = torch.cumsum(positions == 0, dim=1)
    t = positions.shape[1]
    causal = torch.ones(t, t, dtype=torch.bool, device=positions.device).tril()
    return ((segment[:, :, None] == segment[:, None, :]) & causal)[:, None]


@dataclass(frozen=True)
class Segments:
    """Per row, its `(start, end, alone)` token ranges in order: an example's tokens, or with
    `alone` a run of one-token examples."""

    rows: tuple[tuple[tuple[int, int, bool], ...], ...]

    @classmethod
    def of(cls, positions: torch.Tensor) -> Segments:
        """The ranges of packed rows' `positions` (`[B, T]`, restarting at 0 at each example)."""
        rows = []
        for row in positions.cpu().tolist():
            starts = [i for i, p in enumerate(row) if p == 0] + [len(row)]
            ranges: list[tuple[int, int, bool]] = []
            for start, end in itertools.pairwise(starts):
                if end - start == 1 and ranges and ranges[-1][2]:
                    ranges[-1] = (ranges[-1][0], end, True)
                else:
                    ranges.append((start, end, end - start == 1))
            rows.append(tuple(ranges))
        return cls(tuple(rows))

    def attend(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, attend: Attend
    ) -> torch.Tensor:
        """`[B, heads, T, head_dim]` outputs of `[B, heads, T, head_dim]` queries and
        `[B, kv_heads, T, head_dim]` keys and values, each example attended alone by `attend`."""
        groups = q.shape[1] // v.shape[1]
        out = []
        for b, ranges in enumerate(self.rows):
            parts = []
            for start, end, alone in ranges:
                if alone:  # each token sees only itself: its value, its query and key unused
                    parts.append(v[b : b + 1, :, start:end].repeat_interleave(groups, dim=1))
                else:
                    qs, ks, vs = (x[b : b + 1, :, start:end] for x in (q, k, v))
                    parts.append(attend(qs, ks, vs))
            out.append(torch.cat(parts, dim=2))
        return torch.cat(out, dim=0)


def packed_attention(positions: torch.Tensor) -> torch.Tensor | Segments:
    """How packed rows with `positions` are attended (the module's rule)."""
    capturing = positions.is_cuda and torch.cuda.is_current_stream_capturing()
    if positions.numel() >= SEGMENTS_FROM_TOKENS and not capturing:
        return Segments.of(positions)
    return segment_mask(positions)

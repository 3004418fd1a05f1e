"""Cross-entropy of a chunk of half-precision logits and its gradient, in one CUDA kernel.

`rows_in_place(logits, targets)` returns each row's fp32 loss `logsumexp(z) - z[target]` and
overwrites the logits with the gradient of the summed loss, `softmax(z) - onehot(target)`, rounded
once to the logits' dtype; a row whose target is `IGNORE` gets loss 0 and a zero gradient. It is
the arithmetic of the torch path in `loss._HeadCrossEntropy` (each logit widened to fp32, the
log-sum-exp, the softmax and the subtraction in fp32), read in two passes over the row (an online
maximum and sum, then the gradient) where the torch ops make about ten passes over an fp32 copy.
The result is the same on every run: each row's sums run in one fixed order.

Why a kernel of our own and not Liger's cross-entropy: Liger's entry point reads the number of
scored rows back to the host on every call (a step could no longer be recorded in a CUDA graph)
and keeps each row's loss in the logits' 16-bit dtype; its Triton kernel itself is internal API.
Triton is there wherever this runs: it comes with torch's CUDA builds. Compiled kernels are kept
in Aner's persistent Triton cache (`triton_cache`).
"""

from __future__ import annotations

import functools
from typing import Any

import torch

from aner_lang.runtime.model.triton_cache import use_persistent_cache

BLOCK = 8192
"""Logits per step of the row loops (a power of two)."""


@functools.cache
def _kernel() -> Any:
    """The Triton kernel, compiled on first use; None where Triton is not installed."""
    try:
        import triton
        import triton.language as tl
    except ImportError:
        return None
    use_persistent_cache(triton.__version__)

    @triton.jit
    def rows(logits, stride, targets, losses, vocab, ignore, block: tl.constexpr):
        row = tl.program_id(0).to(tl.int64)
        z = logits + row * stride
        target = tl.load(targets + row)
        cols = tl.arange(0, block)
        if target == ignore:
            for start in range(0, vocab, block):
                offs = start + cols
                tl.store(z + offs, tl.zeros([block], tl.float32), mask=offs < vocab)
            tl.store(losses + row, 0.0)
        else:
            top = float("-inf")
            total = 0.0
            for start in range(0, vocab, block):
                offs = start + cols
                x = tl.load(z + offs, mask=offs < vocab, other=float("-inf")).to(tl.float32)
                new_top = tl.maximum(top, tl.max(x, 0))
                total = total * tl.exp(top - new_top) + tl.sum(tl.exp(x - new_top), 0)
                top = new_top
            lse = top + tl.log(total)
            picked = tl.load(z + target).to(tl.float32)
            tl.store(losses + row, lse - picked)
            for start in range(0, vocab, block):
                offs = start + cols
                x = tl.load(z + offs, mask=offs < vocab, other=float("-inf")).to(tl.float32)
                p = tl.exp(x - lse)
                tl.store(z + offs, tl.where(offs == target, p - 1.0, p), mask=offs < vocab)

    return rows


def available(like: torch.Tensor) -> bool:
    """Whether `rows_in_place` takes logits of `like`'s dtype and device (the hidden states they
    are computed from): half precision on CUDA, with Triton."""
    return (
        like.is_cuda and like.dtype in (torch.float16, torch.bfloat16) and (_kernel() is not None)
    )


def rows_in_place(logits: torch.Tensor, targets: torch.Tensor, ignore: int) -> torch.Tensor:
    """Per-row fp32 losses of contiguous `[rows, vocab]` logits; the logits become the gradient
    (see the module docstring). Targets are int64 ids, `ignore` where a row is not scored."""
    n, vocab = logits.shape
    losses = torch.empty(n, dtype=torch.float32, device=logits.device)
    if n:
        _kernel()[(n,)](
            logits, logits.stride(0), targets, losses, vocab, ignore, block=BLOCK, num_warps=16
        )
    return losses

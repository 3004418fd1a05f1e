"""Next-token cross-entropy, summed over the scored targets of a batch.

Targets are next-token ids with `IGNORE` where a position is not scored (prompt tokens,
padding). Two computations of the same sum:

* `logits_loss_sum`: from materialized logits, cast to fp32 (the reference arithmetic, used under
  float32 and wherever the output head is trained).
* `head_loss_sum`: from the final hidden states, through a frozen output head, a chunk of tokens
  at a time. Each chunk's logits are formed, their fp32 loss and the gradient to the chunk's
  hidden states computed together, and the logits dropped; backward only scales the stored
  gradient. The logits of a whole batch (2048 tokens x 128k vocabulary: 1 GiB in fp32, plus their
  gradient) are never held, and the head's matmul runs twice per token (logits, gradient) instead
  of three times (logits, recomputed logits, gradient). Used under half precision, where the loss
  itself is still computed in fp32 from the half-precision logits, as autocast would. On CUDA one
  kernel (`fused_cross_entropy`) turns a chunk's half-precision logits into its losses and, in
  their memory, its gradient; with no fp32 copy, a chunk holds twice the tokens in the same
  workspace (`chunk_tokens`), so the head's matmuls run on longer inputs.
"""

from __future__ import annotations

from typing import Any, cast

import torch
import torch.nn.functional as F

from aner_lang.runtime.model import fused_cross_entropy
from aner_lang.runtime.model.chunking import CHUNK_BYTES
from aner_lang.runtime.model.linear import FrozenLinear
from aner_lang.runtime.model.sections import section

IGNORE = -100


def logits_loss_sum(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Sum of next-token cross-entropy over scored targets (fp32 scalar) from logits [..., V]."""
    flat = logits.float().reshape(-1, logits.shape[-1])
    return F.cross_entropy(flat, targets.reshape(-1), ignore_index=IGNORE, reduction="sum")


def chunk_tokens(vocab_size: int, fused: bool = False) -> int:
    """Tokens per chunk of `head_loss_sum` for a vocabulary of `vocab_size`: fp32 logits of
    `CHUNK_BYTES`, or with the fused kernel 16-bit logits of twice that, which is about the
    workspace the fp32 chunk takes with its 16-bit logits and gradient beside it."""
    return max(1, CHUNK_BYTES // ((1 if fused else 4) * vocab_size))


class _HeadCrossEntropy(torch.autograd.Function):
    """loss = sum over scored rows of CE(head(hidden), targets); gradient to hidden only."""

    @staticmethod
    def forward(
        ctx: Any,
        hidden: torch.Tensor,
        targets: torch.Tensor,
        head: FrozenLinear,
        chunk: int,
        fused: bool,
    ) -> torch.Tensor:
        total = torch.zeros((), dtype=torch.float32, device=hidden.device)
        grad = torch.empty_like(hidden) if ctx.needs_input_grad[0] else None
        rows_loss = _fused_rows if fused else _torch_rows
        for start in range(0, hidden.shape[0], chunk):
            rows = slice(start, start + chunk)
            total += rows_loss(hidden, targets, head, rows, grad)
        ctx.save_for_backward(grad)
        return total

    @staticmethod
    def backward(
        ctx: Any, grad_total: torch.Tensor
    ) -> tuple[torch.Tensor | None, None, None, None, None]:
        (grad,) = ctx.saved_tensors
        if grad is None:
            return None, None, None, None, None
        with section("loss"):
            return grad * grad_total.to(grad.dtype), None, None, None, None


def _fused_rows(
    hidden: torch.Tensor,
    targets: torch.Tensor,
    head: FrozenLinear,
    rows: slice,
    grad: torch.Tensor | None,
) -> torch.Tensor:
    """One chunk's loss sum through the fused kernel; its gradient into `grad[rows]`."""
    logits = head(hidden[rows])
    loss = fused_cross_entropy.rows_in_place(logits, targets[rows], IGNORE).sum()
    if grad is not None:
        grad[rows] = head.grad_input(logits)
    return loss


def _torch_rows(
    hidden: torch.Tensor,
    targets: torch.Tensor,
    head: FrozenLinear,
    rows: slice,
    grad: torch.Tensor | None,
) -> torch.Tensor:
    """One chunk's loss sum in torch ops on fp32 logits; its gradient into `grad[rows]`."""
    tgt = targets[rows]
    scored = tgt != IGNORE
    safe = torch.where(scored, tgt, torch.zeros_like(tgt))
    logits = head(hidden[rows]).float()
    lse = torch.logsumexp(logits, dim=-1)
    picked = logits.gather(1, safe[:, None]).squeeze(1)
    loss = torch.where(scored, lse - picked, torch.zeros_like(lse)).sum()
    if grad is not None:
        probs = logits.sub_(lse[:, None]).exp_()  # softmax, in the logits' memory
        probs[torch.arange(len(tgt), device=tgt.device), safe] -= 1.0
        probs.mul_(scored[:, None])
        grad[rows] = head.grad_input(probs.to(hidden.dtype))
    return loss


def head_loss_sum(hidden: torch.Tensor, head: FrozenLinear, targets: torch.Tensor) -> torch.Tensor:
    """`logits_loss_sum(head(hidden), targets)` computed chunk by chunk (see the module
    docstring); `head` must be frozen (no trainable parameters)."""
    flat = hidden.reshape(-1, hidden.shape[-1])
    fused = fused_cross_entropy.available(flat)
    chunk = chunk_tokens(head.out_features, fused)
    return cast(
        torch.Tensor, _HeadCrossEntropy.apply(flat, targets.reshape(-1), head, chunk, fused)
    )

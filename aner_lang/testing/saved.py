"""What autograd keeps for the backward pass, counted in bytes (tests of activation memory)."""

from __future__ import annotations

from collections.abc import Callable

import torch


def saved_bytes(fn: Callable[..., object], *args: object) -> int:
    """The bytes of the tensors autograd saves for the backward pass of `fn(*args)` (saved-tensor
    hooks installed inside `fn`, such as offloading's, take precedence and are not counted)."""
    total = 0

    def pack(t: torch.Tensor) -> torch.Tensor:
        nonlocal total
        total += t.nbytes
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        fn(*args)
    return total

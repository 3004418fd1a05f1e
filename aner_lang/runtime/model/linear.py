"""Frozen weight matrices behind one interface, so storage formats and adapters can swap them.

Every projection, the embedding table and `lm_head` of `LlamaModel` is a `FrozenLinear`. NF4
(`runtime/nf4`) replaces `DenseLinear` modules with `NF4Linear`; adapters wrap them. Code that
needs the matrix itself (SVD init, DoRA, merge, export) calls `dense_weight()`, never a storage
attribute, so it works for every storage.
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence

import torch
from torch import nn

from aner_lang.runtime.model.activations import product_needed


class FrozenLinear(nn.Module):
    """A frozen `[out_features, in_features]` weight used as `x @ W^T` or as an embedding table."""

    storage: str
    """What this module keeps its weight in: a Storage member name ("float32", "float16",
    "nf4_double_quant"), or "bfloat16" for the 16-bit embedding and `lm_head` of an NF4 base
    whose source stores them in bfloat16."""

    expert_group: object | None = None
    """For a mixture-of-experts expert loaded with its siblings: the `experts.ExpertGroup` that
    holds all their matrices together (what a grouped GEMM multiplies by)."""

    def __init__(self, in_features: int, out_features: int) -> None:
        super().__init__()
        self.in_features = in_features
        self.out_features = out_features

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # pragma: no cover - abstract
        raise NotImplementedError

    def unread(self, x: torch.Tensor) -> torch.Tensor:
        """What `forward` returns where a checkpoint's recomputation never reads its product
        (`activations.product_needed`): memory of the product's shape and dtype, left as it
        is."""
        return x.new_empty((*x.shape[:-1], self.out_features))

    def adds_product(self, x: torch.Tensor) -> bool:
        """Whether `add_product(x, into)` adds its product in the GEMM itself (the product read
        from no tensor of its own), so that a LoRA writes its delta first and the base adds into
        it, where otherwise the delta is added into the base's output, one more pass over it."""
        return False

    def add_product(self, x: torch.Tensor, into: torch.Tensor) -> torch.Tensor:  # pragma: no cover
        """`into += forward(x)` in the GEMM itself, returned; asked only where `adds_product(x)`
        (where `product_needed` says no, ``into`` may stay as it is: nothing reads it)."""
        raise NotImplementedError

    def dense_weight(self, dtype: torch.dtype = torch.float32) -> torch.Tensor:  # pragma: no cover
        """A fresh dense copy of the weight, `[out_features, in_features]`."""
        raise NotImplementedError

    def grad_input(self, grad_y: torch.Tensor) -> torch.Tensor:  # pragma: no cover - abstract
        """`grad_y @ W`: the gradient to the input of `forward`, computed in grad_y's dtype
        (what a fused loss needs without re-running the forward)."""
        raise NotImplementedError

    def adds_grad_input(self, grad_y: torch.Tensor) -> bool:
        """Whether `add_grad_input(grad_y, into)` adds in the GEMM itself (`adds_product`'s
        counterpart in backward: a LoRA then writes its deltas' input gradient first)."""
        return False

    def add_grad_input(self, grad_y: torch.Tensor, into: torch.Tensor) -> torch.Tensor:
        """`into += grad_y @ W` (another input gradient of the same input, of grad_y's dtype);
        returns ``into``. A storage whose GEMM can add into it in place overrides this."""
        return into.add_(self.grad_input(grad_y))

    def rows(self, ids: torch.Tensor) -> torch.Tensor:  # pragma: no cover - abstract
        """Embedding lookup: rows `ids` of the weight, shape `ids.shape + (in_features,)`."""
        raise NotImplementedError

    def nbytes(self) -> dict[str, int]:  # pragma: no cover - abstract
        """Bytes held, per memory category (e.g. {"weights": n} or {"packed_base": n})."""
        raise NotImplementedError

    def extra_repr(self) -> str:
        return (
            f"in_features={self.in_features}, out_features={self.out_features}, "
            f"storage={self.storage}"
        )


def outputs_of(x: torch.Tensor, modules: Sequence[FrozenLinear]) -> list[torch.Tensor]:
    """Each of ``modules`` applied to the one input ``x`` (q/k/v, gate/up, or one projection).
    Where those of them with hooks each have one forward hook, offering ``together(x, hooks)``
    (an adapter's, `adapters.base`), and it returns their outputs, those are computed at once:
    an adapter may share its reads of ``x`` among its targets, and write its delta before the
    base adds its product (`FrozenLinear.adds_product`). Every other module is called as
    usual."""
    hooks = [list(m._forward_hooks.values()) for m in modules]
    hooked = [i for i, h in enumerate(hooks) if h]
    single = all(len(hooks[i]) == 1 and not modules[i]._forward_pre_hooks for i in hooked)
    outs: dict[int, torch.Tensor] = {}
    if hooked and single:
        together = getattr(hooks[hooked[0]][0], "together", None)
        joint = None if together is None else together(x, [hooks[i][0] for i in hooked])
        outs = {} if joint is None else dict(zip(hooked, joint))
    return [outs[i] if i in outs else m(x) for i, m in enumerate(modules)]


STORAGE_DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}
_HALF = (torch.float16, torch.bfloat16)


class DenseLinear(FrozenLinear):
    """A plain float32, float16 or bfloat16 weight.

    The weight is an `nn.Parameter` with `requires_grad=False`, so the `full` method can make it
    trainable in place. A float32 input meets a 16-bit weight converted to float32 per call
    (16-bit storage halves memory, not the precision of activations). Between the two 16-bit
    types the input is converted instead and the result converted back, with autocast off for
    that product: a float16 `lm_head` under bfloat16 compute would otherwise be copied whole
    (1 GiB at a 128k vocabulary) on every call, by this code or by autocast, and float16 holds a
    bfloat16 value's bits where the range allows.
    """

    def __init__(self, weight: torch.Tensor, storage: str = "float32") -> None:
        if storage not in STORAGE_DTYPES:
            raise ValueError(f"DenseLinear storage must be one of {sorted(STORAGE_DTYPES)}")
        out_features, in_features = weight.shape
        super().__init__(in_features, out_features)
        self.storage = storage
        self.weight = nn.Parameter(
            weight.to(STORAGE_DTYPES[storage]).contiguous(), requires_grad=False
        )

    def _compute_dtype(self, x: torch.Tensor) -> torch.dtype:
        """The dtype `x` meets this weight in (see the class docstring)."""
        w = self.weight.dtype
        return w if x.dtype in _HALF and w in _HALF else x.dtype

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        dtype = self._compute_dtype(x)
        w = self.weight if self.weight.dtype == dtype else self.weight.to(dtype)
        with self._in_weight_dtype(x, dtype):
            if x.dim() > 1 and not self.weight.requires_grad and not product_needed(self):
                # the product over no tokens: the node saves what the whole one's would (the
                # weight its backward reads, as cast), so the recomputation's saves line up
                torch.nn.functional.linear(x.to(dtype).narrow(-2, 0, 0), w)
                return self.unread(x)
            return torch.nn.functional.linear(x.to(dtype), w).to(x.dtype)

    def _in_weight_dtype(
        self, x: torch.Tensor, dtype: torch.dtype
    ) -> torch.autocast | contextlib.nullcontext[None]:
        """Autocast off where the product runs in the 16-bit weight's own dtype (see above)."""
        if dtype in _HALF:
            return torch.autocast(x.device.type, enabled=False)
        return contextlib.nullcontext()

    def dense_weight(self, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        return self.weight.detach().to(dtype=dtype, copy=True)

    def grad_input(self, grad_y: torch.Tensor) -> torch.Tensor:
        dtype = self._compute_dtype(grad_y)
        with self._in_weight_dtype(grad_y, dtype):
            return (grad_y.to(dtype) @ self.weight.detach().to(dtype)).to(grad_y.dtype)

    def rows(self, ids: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.embedding(ids, self.weight)

    def nbytes(self) -> dict[str, int]:
        return {"weights": self.weight.nbytes}

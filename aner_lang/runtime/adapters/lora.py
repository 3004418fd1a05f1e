"""LoRA, LoRA-FA and DoRA: `y = W x + s * B (A dropout(x))`, `s = alpha / rank`.

Initialisation is PEFT's (research/training.md section 6): A is kaiming-uniform with a = sqrt(5),
i.e. U(-1/sqrt(in), 1/sqrt(in)), drawn from a generator seeded with `seed`, target by target in
model order; B is zero. LoRA-FA (section 4) freezes A (stored with the adapter) and trains B.
DoRA (section 6) adds a trainable row magnitude m, initialised to the row norms of W, and scales
the adapted output by m / ||W + s B A||_row with the norm detached, as in the paper and PEFT.
"""

from __future__ import annotations

import contextvars
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F

from aner_lang.problems.errors import AnerRuntimeError
from aner_lang.runtime.adapters.base import Adapter, target_modules
from aner_lang.runtime.model.experts import ALIGN_BYTES, grouped_mm
from aner_lang.runtime.model.precision import compute_dtype, matmul
from aner_lang.runtime.model.sections import section


def _kaiming_uniform(shape: tuple[int, int], gen: torch.Generator) -> torch.Tensor:
    bound = 1.0 / shape[1] ** 0.5
    return (torch.rand(shape, generator=gen, dtype=torch.float32) * 2 - 1) * bound


class LoRA(Adapter):
    """QLoRA-style adapter; `freeze_a` gives LoRA-FA."""

    method = "lora"
    freeze_a = False

    def __init__(
        self, model, rank: int, alpha: float, dropout: float, targets: list[str], seed: int
    ) -> None:
        super().__init__(
            model,
            {
                "method": self.method,
                "rank": rank,
                "alpha": alpha,
                "dropout": dropout,
                "targets": list(targets),
                "seed": seed,
            },
        )
        self.rank, self.scaling, self.p = rank, alpha / rank, dropout
        self.targets = target_modules(model, targets)
        largest = min(min(m.in_features, m.out_features) for _, m in self.targets)
        if rank > largest:  # checked before allocating: a rank from a file may be huge
            raise AnerRuntimeError(
                f"rank {rank} is larger than the smallest target matrix allows ({largest})",
                code="E-ADAPTER-RANK",
                notes=("a rank above min(rows, columns) adds nothing a smaller one cannot",),
            )
        gen = torch.Generator().manual_seed(seed)
        dev = model.device
        self._a: list[torch.Tensor] = []
        self._b: list[torch.Tensor] = []
        for name, module in self.targets:
            a = _kaiming_uniform((rank, module.in_features), gen).to(dev)
            b = torch.zeros(module.out_features, rank, device=dev)
            (self.frozen if self.freeze_a else self.params)[f"{name}.lora_A"] = a
            self.params[f"{name}.lora_B"] = b
            self._a.append(a)
            self._b.append(b)
        for p in self.params.values():
            p.requires_grad_(True)

    def _lora(self, index: int, x: torch.Tensor) -> torch.Tensor:
        """`s * B (A x)` of target `index` on an already dropped-out input."""
        a, b = self._a[index], self._b[index]
        return F.linear(F.linear(x, a.to(x.dtype)), b.to(x.dtype)) * self.scaling

    def _delta(self, index: int, x: torch.Tensor) -> torch.Tensor:
        return self._lora(index, self.dropout(x, self.p))

    def _apply(self, index: int, x: torch.Tensor, base_out: torch.Tensor) -> torch.Tensor:
        """In half precision, training without dropout, `base_out + s * B (A x)` is one autograd
        node with the frozen base's own input gradient (`_OnBase`); otherwise (dropout, or no
        gradients: evaluation and generation, where a node's cost per call buys nothing) one GEMM
        that accumulates into the base output in place (`addmm_`/`baddbmm_` on the output itself,
        fp32 accumulation, one rounding) instead of a GEMM, a scaling pass and an addition pass
        over the output, or the copy of the base output an out-of-place `addmm` makes first (no
        backward needs the base output itself). Never in place on a reshaped view of it: autograd
        would record that as a slice copy, and its backward copies the whole gradient twice.
        float32 keeps PEFT's separate operations, the reference arithmetic."""
        if base_out.dtype == torch.float32:
            return super()._apply(index, x, base_out)
        a, b = self._a[index], self._b[index]
        xd = self.dropout(x, self.p)
        if xd is x and torch.is_grad_enabled():
            module = self.targets[index][1]
            out = base_out.detach().contiguous()
            return _OnBase.apply(x, a, b, out, module.grad_input, self.scaling)
        xa = F.linear(xd, a.to(x.dtype))
        bt = b.to(x.dtype).t()
        out = base_out.contiguous()
        if out.dim() == 2:
            return out.addmm_(xa, bt, alpha=self.scaling)
        if out.dim() == 3:
            return out.baddbmm_(xa, bt.expand(out.shape[0], *bt.shape), alpha=self.scaling)
        flat = torch.addmm(
            out.reshape(-1, out.shape[-1]), xa.reshape(-1, self.rank), bt, alpha=self.scaling
        )
        return flat.view(out.shape)

    groups_experts = True

    def grouped_delta(
        self, indices: list[int], x: torch.Tensor, offs: torch.Tensor
    ) -> torch.Tensor:
        """``s * B_e (A_e dropout(x))`` of each expert's rows, two grouped GEMMs for all targets
        ``indices``, in the compute dtype. The rank is padded with zero
        rows of A and zero columns of B to the grouped GEMM's 16-byte rows: exact zeros added."""
        dtype = compute_dtype(x)
        pad = -self.rank % (ALIGN_BYTES // dtype.itemsize)
        a = F.pad(torch.stack([self._a[i] for i in indices]).to(dtype), (0, 0, 0, pad))
        b = F.pad(torch.stack([self._b[i] for i in indices]).to(dtype), (0, pad))
        xa = grouped_mm(self.dropout(x, self.p).to(dtype), a.transpose(1, 2), offs)
        return (grouped_mm(xa, b.transpose(1, 2), offs) * self.scaling).to(x.dtype)


class LoRAFA(LoRA):
    """LoRA with A frozen at its random init and only B trained."""

    method = "lora_fa"
    freeze_a = True


class DoRA(LoRA):
    """Weight-decomposed LoRA: trainable magnitude per output row plus a LoRA direction."""

    method = "dora"
    groups_experts = False  # its norm needs each expert's whole adapted weight
    keeps_base_output = True  # its magnitude's gradient reads the adapted output

    def __init__(
        self, model, rank: int, alpha: float, dropout: float, targets: list[str], seed: int
    ) -> None:
        super().__init__(model, rank, alpha, dropout, targets, seed)
        self._m: list[torch.Tensor] = []
        for name, module in self.targets:
            m = torch.linalg.norm(module.dense_weight(), dim=1).to(model.device)
            m.requires_grad_(True)
            self.params[f"{name}.lora_magnitude"] = m
            self._m.append(m)

    def _apply(self, index: int, x: torch.Tensor, base_out: torch.Tensor) -> torch.Tensor:
        module = self.targets[index][1]
        a, b = self._a[index], self._b[index]
        with torch.no_grad():  # the norm is a constant in backward (DoRA section 4.3)
            w = module.dense_weight().to(a.device) + self.scaling * (b @ a)
            norm = torch.linalg.norm(w, dim=1)
        scale = (self._m[index] / norm).to(base_out.dtype)
        xd = self.dropout(x, self.p)
        if xd is not x:  # PEFT: with dropout the base output is taken on the dropped-out input
            base_out = module.forward(xd)  # not module(): that would re-enter this hook
        return scale * (base_out + self._lora(index, xd))


class _OnBase(torch.autograd.Function):
    """A frozen target's output with its LoRA delta, `base_out + s * (x A^T) B^T`, as one node
    whose backward also takes the base's input gradient: `dx = grad_input(g) + (s g B) A`,
    accumulated in place into the base's fresh gradient (one GEMM with beta 1), where a node per
    operation would write the delta's input gradient apart and autograd would add the two, three
    more passes over an `[tokens, in_features]` tensor per target.

    The base's forward already ran: its output arrives detached and contiguous (the base's own
    node is dropped unused) and the delta accumulates into it in place. `grad_input` runs in
    the forward's context: on CUDA, backward runs on autograd's own thread, which does not see
    the run's context variables (the NF4 backend).

    `A` and `B` (fp32 masters) meet the input in its dtype, cast once in the forward; backward
    reuses those casts (saved: the adapter once more in 16 bits, against a cast kernel per
    matrix twice an update). Rounding: the output and `s g B` are those of the separate
    operations (each product rounded to the compute dtype, then scaled); the input gradient's
    two products are summed in fp32 and rounded once; the gradients of `A` and `B` are fp32
    products (on CUDA straight from cuBLAS's fp32 accumulators, `precision.matmul`, not rounded
    to 16 bits and cast back), `B`'s scaled in fp32."""

    @staticmethod
    def forward(
        ctx: Any,
        x: torch.Tensor,
        a: torch.Tensor,
        b: torch.Tensor,
        base_out: torch.Tensor,
        grad_input: Callable[[torch.Tensor], torch.Tensor],
        scaling: float,
    ) -> torch.Tensor:
        a_c, b_c = a.to(x.dtype), b.to(x.dtype)
        xa = x.reshape(-1, x.shape[-1]) @ a_c.t()
        base_out.view(-1, base_out.shape[-1]).addmm_(xa, b_c.t(), alpha=scaling)
        ctx.save_for_backward(x, xa, a_c, b_c)
        ctx.grad_input, ctx.scaling = grad_input, scaling
        ctx.context = contextvars.copy_context()
        ctx.mark_dirty(base_out)
        return base_out

    @staticmethod
    def backward(ctx: Any, g: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        x, xa, a_c, b_c = ctx.saved_tensors
        grads = g.reshape(-1, g.shape[-1])
        dx = da = db = None
        if ctx.needs_input_grad[0]:
            with section("nf4_backward"):
                dx = ctx.context.run(ctx.grad_input, g).contiguous()
        with section("lora"):
            gb = (grads @ b_c).mul_(ctx.scaling)
            if dx is not None:
                dx.view(-1, dx.shape[-1]).addmm_(gb, a_c)
            if ctx.needs_input_grad[1]:
                da = matmul(gb.t(), x.reshape(-1, x.shape[-1]), torch.float32)
            if ctx.needs_input_grad[2]:
                db = matmul(grads.t(), xa, torch.float32).mul_(ctx.scaling)
        return dx, da, db, None, None, None

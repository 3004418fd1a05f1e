"""LoRA, LoRA-FA and DoRA: `y = W x + s * B (A dropout(x))`, `s = alpha / rank`.

Initialisation is PEFT's (research/training.md section 6): A is kaiming-uniform with a = sqrt(5),
i.e. U(-1/sqrt(in), 1/sqrt(in)), drawn from a generator seeded with `seed`, target by target in
model order; B is zero. LoRA-FA (section 4) freezes A (stored with the adapter) and trains B.
DoRA (section 6) adds a trainable row magnitude m, initialised to the row norms of W, and scales
the adapted output by m / ||W + s B A||_row with the norm detached, as in the paper and PEFT.
"""

from __future__ import annotations

import contextvars
from typing import Any

import torch
import torch.nn.functional as F

from aner_lang.problems.errors import AnerRuntimeError
from aner_lang.runtime.adapters.base import Adapter, target_modules
from aner_lang.runtime.model.experts import ALIGN_BYTES, grouped_mm
from aner_lang.runtime.model.linear import FrozenLinear
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
        node with the frozen base's own input gradient (`_OnBases`); otherwise (dropout, or no
        gradients: evaluation and generation, where a node's cost per call buys nothing) one GEMM
        that accumulates into the base output in place (`addmm_`/`baddbmm_` on the output itself,
        fp32 accumulation, one rounding) instead of a GEMM, a scaling pass and an addition pass
        over the output, or the copy of the base output an out-of-place `addmm` makes first (no
        backward needs the base output itself). Never in place on a reshaped view of it: autograd
        would record that as a slice copy, and its backward copies the whole gradient twice.
        float32 keeps PEFT's separate operations, the reference arithmetic."""
        if base_out.dtype == torch.float32:
            return super()._apply(index, x, base_out)
        if self._takes_one_node(base_out.dtype):
            return _OnBases.apply(x, self.scaling, *self._one_node([index], [base_out]))
        xd = self.dropout(x, self.p)
        a, b = self._a[index], self._b[index]
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

    shares_input = True

    def together(self, indices: list[int], x: torch.Tensor) -> list[torch.Tensor] | None:
        """Targets ``indices``, which read the same input, with their deltas, as one autograd
        node (`_OnBases`): the input is read once for all their A products, forward and
        backward, and their input gradients meet in one tensor. Where `_apply` would not take
        its one-node path (float32, dropout, no gradients), None: each target runs alone."""
        if not self._takes_one_node(x.dtype):
            return None
        with section("lora"):  # the bases' products inside take their own section
            outs = _OnBases.apply(x, self.scaling, *self._one_node(indices, []))
        return list(outs) if len(indices) > 1 else [outs]

    def _takes_one_node(self, dtype: torch.dtype) -> bool:
        """Whether outputs of ``dtype`` take the one-node path (`_OnBases`): half precision,
        gradients on, no dropout (the one rule of `_apply` and `together`)."""
        return dtype != torch.float32 and torch.is_grad_enabled() and not self.drops(self.p)

    def _one_node(self, indices: list[int], bases: list[torch.Tensor]) -> list[Any]:
        """`_OnBases`'s arguments after the input and the scaling, for targets ``indices`` whose
        base outputs are ``bases`` (a hook's, where the base ran already), or none (computed
        within)."""
        modules = [self.targets[i][1] for i in indices]
        return [
            modules,
            *(self._a[i] for i in indices),
            *(self._b[i] for i in indices),
            *(out.detach().contiguous() for out in bases),
        ]

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
    shares_input = False  # each target's norm and magnitude scale its own output
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


class _OnBases(torch.autograd.Function):
    """Frozen targets that read one input ``x`` (one target, or q/k/v, or gate/up), each output
    with its LoRA delta, `out_i = base_i + s * (x A_i^T) B_i^T`, as one node whose backward also
    takes the bases' input gradient: `dx = sum_i grad_input_i(g_i) + (s [g_1 B_1 | ... | g_n B_n])
    [A_1; ...; A_n]`, where a node per operation would write each delta's input gradient apart
    and autograd would add them all, several more passes over an `[tokens, in_features]` tensor
    per target.

    Several targets share each read of ``x``: one GEMM over the stacked A's (`[n * r, in]`) gives
    every `x A_i^T` in the forward, one gives every A's gradient in backward, and the deltas'
    input gradient is one GEMM of depth `n * r`; the bases' input gradients are summed into the
    first one's tensor (`FrozenLinear.add_grad_input`: the GEMM adds into it where it can).

    A hook (`LoRA._apply`) brings its base's output, the base having run already: it arrives
    detached and contiguous (the base's own node is dropped unused) and the delta accumulates into
    it in place. Otherwise (`LoRA.together`) each base runs within, and where its GEMM adds into a
    tensor (`FrozenLinear.adds_product`) the delta is written first and the base adds its product
    into it (`_with_delta`). The bases' input gradients run in the forward's context: on CUDA,
    backward runs on autograd's own thread, which does not see the run's context variables (the
    NF4 backend).

    `A` and `B` (fp32 masters) meet the input in its dtype, cast once in the forward; backward
    reuses those casts (saved: the adapter once more in 16 bits, against a cast kernel per
    matrix twice an update). Rounding: each output is two products summed from fp32 and rounded
    once, one of them rounded to the compute dtype before (the base's product, or where the delta
    goes first the delta); `s g_i B_i` is the separate operations' (the product rounded, then
    scaled); the deltas' input gradient is one fp32 product rounded once into the bases'
    gradient; the gradients of `A` and `B` are fp32 products (on CUDA straight from cuBLAS's
    fp32 accumulators, `precision.matmul`, not rounded to 16 bits and cast back), `B`'s scaled
    in fp32."""

    @staticmethod
    def forward(
        ctx: Any,
        x: torch.Tensor,
        scaling: float,
        modules: list[FrozenLinear],
        *tensors: torch.Tensor,
    ) -> tuple[torch.Tensor, ...] | torch.Tensor:
        n = len(modules)
        a, b, given = tensors[:n], tensors[n : 2 * n], tensors[2 * n :]
        a_c = torch.cat([t.to(x.dtype) for t in a]) if n > 1 else a[0].to(x.dtype)
        b_c = [t.to(x.dtype) for t in b]
        xa = x.reshape(-1, x.shape[-1]) @ a_c.t()
        rank = a[0].shape[0]
        outs = []
        for i, (module, b_i) in enumerate(zip(modules, b_c)):
            xa_i = xa[:, i * rank : (i + 1) * rank]
            base = given[i] if given else None
            outs.append(_with_delta(module, x, xa_i, b_i, scaling, base))
        ctx.save_for_backward(x, xa, a_c, *b_c)
        ctx.modules, ctx.scaling, ctx.rank = modules, scaling, rank
        ctx.context = contextvars.copy_context()
        if given:
            ctx.mark_dirty(*given)
        return tuple(outs) if n > 1 else outs[0]

    @staticmethod
    def backward(ctx: Any, *grads: torch.Tensor | None) -> tuple[torch.Tensor | None, ...]:
        x, xa, a_c, *b_c = ctx.saved_tensors
        n, r, s = len(b_c), ctx.rank, ctx.scaling
        x2 = x.reshape(-1, x.shape[-1])
        gs = [None if g is None else g.reshape(-1, g.shape[-1]) for g in grads]
        with section("lora"):
            gb = [x2.new_zeros(x2.shape[0], r) if g is None else g @ b for g, b in zip(gs, b_c)]
            gb_all = (torch.cat(gb, dim=1) if n > 1 else gb[0]).mul_(s)
        dx = None
        if ctx.needs_input_grad[0]:
            dx = ctx.context.run(_input_gradient, ctx.modules, grads, gb_all, a_c, x.shape)
        da: list[torch.Tensor | None] = [None] * n
        db: list[torch.Tensor | None] = [None] * n
        with section("lora"):
            if any(ctx.needs_input_grad[3 : 3 + n]):
                da = list(matmul(gb_all.t(), x2, torch.float32).split(r))
            for i, g in enumerate(gs):
                if g is not None and ctx.needs_input_grad[3 + n + i]:
                    db[i] = matmul(g.t(), xa[:, i * r : (i + 1) * r], torch.float32).mul_(s)
        return dx, None, None, *da, *db, *([None] * n)


def _with_delta(
    module: FrozenLinear,
    x: torch.Tensor,
    xa: torch.Tensor,
    b: torch.Tensor,
    scaling: float,
    base: torch.Tensor | None,
) -> torch.Tensor:
    """`module`'s output on ``x`` with the delta `s * xa B^T`: added into ``base`` (its output,
    where it ran already), or, where the module's GEMM adds in place (`adds_product`), written
    first (one GEMM, scaled in fp32 and rounded once) with the base's product added into it,
    which saves a pass over the output; else added into the module's fresh output."""
    if base is None and module.adds_product(x):
        out = x.new_empty(*x.shape[:-1], b.shape[0])
        flat = out.view(-1, b.shape[0])
        torch.addmm(flat, xa, b.t(), beta=0, alpha=scaling, out=flat)  # beta 0: flat is not read
        return module.add_product(x, out)
    out = module.forward(x).contiguous() if base is None else base
    out.view(-1, out.shape[-1]).addmm_(xa, b.t(), alpha=scaling)
    return out


def _input_gradient(
    modules: list[FrozenLinear],
    grads: tuple[torch.Tensor | None, ...],
    gb: torch.Tensor,
    a: torch.Tensor,
    shape: torch.Size,
) -> torch.Tensor | None:
    """`sum_i g_i W_i + gb A`: the bases' input gradients and the deltas' (``gb`` the stacked
    `s g_i B_i`). Where every base's GEMM adds into a tensor (`adds_grad_input`), the deltas'
    product is written first and the bases add into it; otherwise the first base's gradient is
    the tensor the others' and the deltas' are added into."""
    present = [(m, g) for m, g in zip(modules, grads) if g is not None]
    if not present:
        return None
    if all(m.adds_grad_input(g) for m, g in present):
        with section("lora"):
            dx = torch.mm(gb, a).view(*shape)
        with section("nf4_backward"):
            for m, g in present:
                dx = m.add_grad_input(g, dx)
        return dx
    with section("nf4_backward"):
        module, g = present[0]
        dx = module.grad_input(g).contiguous()
        for m, g in present[1:]:
            dx = m.add_grad_input(g, dx)
    with section("lora"):
        dx.view(-1, dx.shape[-1]).addmm_(gb, a)
    return dx

"""Grouped GEMMs for mixture-of-experts layers: one matrix product over every expert's rows.

A MoE layer sorts its token-expert pairs by expert, so expert e's rows are one contiguous slice
of the routed input, ending at ``offs[e]`` (int32 cumulative counts, on the device). A grouped GEMM
multiplies each slice by its expert's matrix in one kernel (`torch._grouped_mm`): no loop over the
experts on the host, no host read of the group sizes, so no synchronisation and a step CUDA graphs
can record. Where the kernel cannot run (a dtype or a row width it does not take on that device)
`grouped_mm` loops over the groups instead, reading their sizes on the host; the numbers are the
same products.

The frozen base of a projection meets the grouped GEMM as one ``[E, out, in]`` stack. Experts
loaded together keep their matrices in one tensor (`ExpertGroup`: the dense stack, or one NF4
weight quantized over all of them), so the stack costs nothing for 16/32-bit storage and one
dequantization for NF4; other experts are stacked from their dense weights on each use. The stack
is never saved for backward: the input gradient builds it again (`GroupedFrozenMatmul`), as the
NF4 matmul re-dequantizes.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol, TypeVar, cast

import torch

from aner_lang.runtime.model.linear import DenseLinear, FrozenLinear
from aner_lang.runtime.model.precision import compute_dtype

Expert = TypeVar("Expert", bound=FrozenLinear)

ALIGN_BYTES = 16
"""`torch._grouped_mm` reads rows with 16-byte loads: each operand's row width, in bytes, must be
a multiple of this."""


def kernel_runs(dtype: torch.dtype, device: torch.device, k: int, n: int) -> bool:
    """Whether `torch._grouped_mm` multiplies ``[M, k]`` by ``[E, k, n]`` of ``dtype`` on
    ``device``: bfloat16 on a Hopper-or-later GPU (its CUDA kernels are CUTLASS's sm90 grouped
    GEMMs), float32 or bfloat16 on the CPU, with 16-byte-aligned rows."""
    if not hasattr(torch, "_grouped_mm"):
        return False
    if device.type == "cuda":
        if dtype != torch.bfloat16 or torch.cuda.get_device_capability(device)[0] < 9:
            return False
    elif device.type != "cpu" or dtype not in (torch.float32, torch.bfloat16):
        return False
    return (k * dtype.itemsize) % ALIGN_BYTES == 0 and (n * dtype.itemsize) % ALIGN_BYTES == 0


def grouped_mm(a: torch.Tensor, b: torch.Tensor, offs: torch.Tensor) -> torch.Tensor:
    """Rows ``[offs[g-1], offs[g])`` of ``a`` ``[M, K]`` times ``b[g]`` (``b`` ``[E, K, N]``, either
    memory order of its last two dimensions), as one ``[M, N]`` tensor in a's dtype; differentiable
    in both. Autocast is off inside: the caller picks the operands' dtype."""
    with torch.autocast(a.device.type, enabled=False):
        if a.dtype == b.dtype and kernel_runs(a.dtype, a.device, a.shape[1], b.shape[2]):
            return torch._grouped_mm(a, b, offs=offs)
        ends = offs.tolist()
        starts = [0, *ends[:-1]]
        parts = [a[s:e] @ b[g] for g, (s, e) in enumerate(zip(starts, ends)) if e > s]
        return torch.cat(parts) if parts else a.new_zeros(a.shape[0], b.shape[2])


def row_alignment(x: torch.Tensor, dtype: torch.dtype) -> int:
    """Rows each expert's group is padded to a multiple of, for rows of ``x``'s device computed in
    ``dtype``: on CUDA 16 bytes of them, as the CUTLASS kernels' weight gradients contract over
    the rows and read each group from a 16-byte boundary (the alignment torchtitan pads MoE token
    groups to); the CPU kernel takes groups of any size."""
    if not x.is_cuda:
        return 1
    return max(1, ALIGN_BYTES // dtype.itemsize)


def padded_groups(
    x: torch.Tensor, counts: torch.Tensor, align: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Rows ``x`` grouped by expert (``counts[e]`` rows each, in order) laid out with every group
    padded by zero rows to a multiple of ``align``: (padded rows, the groups' int32 ends, each
    row's place there). The padded size is a bound known without reading ``counts`` on the host
    (``len(x) + E * (align - 1)``), so a CUDA graph can record it; the rows past the last padded
    group go to the last expert as zeros. Zero rows add nothing to any gradient."""
    rows, experts = x.shape[0], counts.shape[0]
    if align == 1:
        return x, counts.cumsum(0).to(torch.int32), torch.arange(rows, device=x.device)
    padded = (counts + align - 1) // align * align
    shift = (padded.cumsum(0) - padded) - (counts.cumsum(0) - counts)
    place = torch.arange(rows, device=x.device) + shift.repeat_interleave(counts, output_size=rows)
    size = rows + experts * (align - 1)
    ends = padded.cumsum(0).to(torch.int32)
    ends[-1:].fill_(size)
    return x.new_zeros(size, x.shape[1]).index_copy(0, place, x), ends, place


class ExpertGroup(Protocol):
    """The matrices of one projection's E experts, stored together (built by the loader)."""

    def stack(self, dtype: torch.dtype) -> torch.Tensor:
        """The ``[E, out, in]`` dense stack in ``dtype`` (a view where no conversion is needed)."""
        ...

    def holds(self, modules: Sequence[FrozenLinear]) -> bool:
        """Whether ``modules`` are still this group's experts, in order, over its memory (a copy
        or a functional replacement of one is not)."""
        ...


class DenseExpertGroup:
    """Experts whose `DenseLinear` weights are slices of one ``[E, out, in]`` tensor."""

    def __init__(self, weights: torch.Tensor) -> None:
        self.weights = weights

    def stack(self, dtype: torch.dtype) -> torch.Tensor:
        return self.weights.to(dtype)

    def holds(self, modules: Sequence[FrozenLinear]) -> bool:
        count = self.weights.shape[0]
        return holds_slices(modules, DenseLinear, "weight", self.weights, count) and not any(
            m.weight.requires_grad for m in modules
        )


def holds_slices(
    modules: Sequence[FrozenLinear], kind: type, tensor: str, joint: torch.Tensor, count: int
) -> bool:
    """Whether ``modules`` are ``count`` ``kind`` modules whose ``tensor`` (a buffer or the
    weight) is, in order, one of the equal consecutive slices of ``joint``."""
    step = joint.numel() // count * joint.element_size()
    return len(modules) == count and all(
        isinstance(m, kind) and getattr(m, tensor).data_ptr() == joint.data_ptr() + e * step
        for e, m in enumerate(modules)
    )


def joined(experts: list[Expert], group: ExpertGroup) -> list[Expert]:
    """``experts``, each marked as one of ``group`` (`FrozenLinear.expert_group`)."""
    for m in experts:
        m.expert_group = group
    return experts


def dense_experts(weights: torch.Tensor, storage: str) -> list[DenseLinear]:
    """E `DenseLinear` experts over the slices of ``weights`` ``[E, out, in]`` (converted to the
    storage's dtype once), grouped for the grouped GEMMs."""
    stacked = DenseLinear(weights.flatten(0, 1), storage).weight.detach().view(weights.shape)
    return joined([DenseLinear(w, storage) for w in stacked], DenseExpertGroup(stacked))


def expert_group(modules: Sequence[FrozenLinear]) -> ExpertGroup | None:
    """The group that ``modules`` (every expert of one projection, in order) still form, if any."""
    group = cast(ExpertGroup | None, getattr(modules[0], "expert_group", None))
    return group if group is not None and group.holds(modules) else None


def groupable(modules: Sequence[FrozenLinear]) -> bool:
    """Whether the experts' frozen products can run as one grouped GEMM: each is a frozen base
    (a trainable dense weight, as the `full` method makes one, goes through its own module)."""
    return all(not (isinstance(m, DenseLinear) and m.weight.requires_grad) for m in modules)


def _stack(modules: Sequence[FrozenLinear], dtype: torch.dtype) -> torch.Tensor:
    group = expert_group(modules)
    if group is not None:
        return group.stack(dtype)
    return torch.stack([m.dense_weight(dtype) for m in modules])


def base_dtype(modules: Sequence[FrozenLinear], x: torch.Tensor) -> torch.dtype:
    """The dtype the experts' frozen product runs in: the compute dtype, except that a 16-bit
    dense weight meets a 16-bit input in its own dtype (`DenseLinear`'s rule: a float16 weight is
    never rounded to bfloat16)."""
    first = modules[0]
    if isinstance(first, DenseLinear):
        return first._compute_dtype(x.to(compute_dtype(x)))
    return compute_dtype(x)


class GroupedFrozenMatmul(torch.autograd.Function):
    """``x @ W_e^T`` for every expert's rows; gradient to x only (the experts are frozen), from
    the stack built again in backward rather than saved."""

    @staticmethod
    def forward(
        ctx: Any,
        x: torch.Tensor,
        offs: torch.Tensor,
        modules: Sequence[FrozenLinear],
        dtype: torch.dtype,
    ) -> torch.Tensor:
        ctx.modules, ctx.dtype = modules, dtype
        ctx.save_for_backward(offs)
        w = _stack(modules, dtype)
        return grouped_mm(x.to(dtype), w.transpose(1, 2), offs).to(x.dtype)

    @staticmethod
    def backward(ctx: Any, grad_y: torch.Tensor) -> tuple[torch.Tensor | None, None, None, None]:
        if not ctx.needs_input_grad[0]:
            return None, None, None, None
        (offs,) = ctx.saved_tensors
        w = _stack(ctx.modules, ctx.dtype)
        grad_x = grouped_mm(grad_y.to(ctx.dtype).contiguous(), w, offs)
        return grad_x.to(grad_y.dtype), None, None, None


def grouped_frozen(
    x: torch.Tensor, offs: torch.Tensor, modules: Sequence[FrozenLinear]
) -> torch.Tensor:
    """The experts' frozen products of the grouped rows ``x`` (see `GroupedFrozenMatmul`)."""
    return cast(torch.Tensor, GroupedFrozenMatmul.apply(x, offs, modules, base_dtype(modules, x)))

"""RMSNorm, SwiGLU and the rotary embedding as Triton kernels, one per direction, each an autograd
function: the half-precision path of `fused_ops` on CUDA.

The arithmetic is the one of `fused_ops`' torch functions (and of HF's Llama), widened to fp32
from the 16-bit inputs and rounded once where HF rounds:

- RMSNorm: `rstd = 1/sqrt(mean(x^2) + eps)` per row in fp32; `y = w * round(x * rstd)` with the
  fp32 weight, rounded to x's dtype. Backward: `dx = rstd * (g - n * mean(g * n))` with
  `g = dy * w` and `n = x * rstd` in fp32, `dw = sum over rows of dy * round(n)`. Kept for
  backward: x and the fp32 rstd (one number per row).
- SwiGLU: `round(silu(gate)) * up`, rounded once more; backward recomputes the sigmoid from the
  kept gate and up: `dup = dy * silu(gate)`, `dgate = dy * up * s * (1 + gate * (1 - s))`.
- RoPE: queries and keys rotated by the fp32 angles (`y1 = x1*cos1 - x2*sin1`,
  `y2 = x2*cos2 + x1*sin2` over the two halves of a head) and rounded once; backward applies the
  transposed rotation. Kept for backward: the angles only.

The kernels read their inputs and write fresh outputs; they never write over a tensor they were
given (a saved input may be read again: an adapter's recomputation, a second backward). Each
row's sums run in one fixed order, so a result is the same on every run; Triton's fp32
exponential and summation order differ from torch's in the last fp32 bits, which can show after
rounding to the 16-bit dtype.

The kernels are compiled on first use into Aner's persistent Triton cache (`triton_cache`). Under
`TRITON_INTERPRET=1` Triton runs them on CPU tensors, which is how they are tested without a GPU.
"""

from __future__ import annotations

import functools
from typing import Any, NamedTuple, cast

import torch

from aner_lang.runtime.model.triton_cache import use_persistent_cache

ELEMENTS = 1024
"""Elements per program of the SwiGLU kernels (a power of two)."""


class Kernels(NamedTuple):
    rms_forward: Any
    rms_backward: Any
    swiglu_forward: Any
    swiglu_backward: Any
    rope: Any


@functools.cache
def kernels() -> Kernels | None:
    """The Triton kernels, defined on first use; None where Triton is not installed. Whether they
    are compiled or interpreted is decided here, from `TRITON_INTERPRET`."""
    try:
        import triton
        import triton.language as tl
    except ImportError:
        return None
    use_persistent_cache(triton.__version__)

    @triton.jit
    def rms_forward(x, x_stride, w, y, rstd, cols, eps, block: tl.constexpr):
        row = tl.program_id(0).to(tl.int64)
        offs = tl.arange(0, block)
        mask = offs < cols
        h = tl.load(x + row * x_stride + offs, mask=mask, other=0.0).to(tl.float32)
        r = tl.rsqrt(tl.sum(h * h, 0) / cols + eps)
        tl.store(rstd + row, r)
        normed = (h * r).to(x.dtype.element_ty).to(tl.float32)
        weight = tl.load(w + offs, mask=mask, other=0.0).to(tl.float32)
        tl.store(y + row * cols + offs, normed * weight, mask=mask)

    @triton.jit
    def rms_backward(
        dy, x, x_stride, w, rstd, dx, dw_part, rows, cols, programs,
        block: tl.constexpr, want_dw: tl.constexpr,
    ):  # fmt: skip
        first = tl.program_id(0).to(tl.int64)
        offs = tl.arange(0, block)
        mask = offs < cols
        weight = tl.load(w + offs, mask=mask, other=0.0).to(tl.float32)
        acc = tl.zeros([block], tl.float32)
        for row in range(first, rows, programs):
            g_out = tl.load(dy + row * cols + offs, mask=mask, other=0.0).to(tl.float32)
            h = tl.load(x + row * x_stride + offs, mask=mask, other=0.0).to(tl.float32)
            r = tl.load(rstd + row)
            normed = h * r
            g = g_out * weight
            grad = r * (g - normed * (tl.sum(g * normed, 0) / cols))
            tl.store(dx + row * cols + offs, grad, mask=mask)
            if want_dw:
                acc += g_out * normed.to(x.dtype.element_ty).to(tl.float32)
        if want_dw:
            tl.store(dw_part + first * cols + offs, acc, mask=mask)

    @triton.jit
    def swiglu_forward(gate, up, out, n, block: tl.constexpr):
        offs = tl.program_id(0).to(tl.int64) * block + tl.arange(0, block)
        mask = offs < n
        g = tl.load(gate + offs, mask=mask, other=0.0).to(tl.float32)
        u = tl.load(up + offs, mask=mask, other=0.0)
        act = (g * tl.sigmoid(g)).to(u.dtype).to(tl.float32)
        tl.store(out + offs, act * u.to(tl.float32), mask=mask)

    @triton.jit
    def swiglu_backward(dy, gate, up, d_gate, d_up, n, block: tl.constexpr):
        offs = tl.program_id(0).to(tl.int64) * block + tl.arange(0, block)
        mask = offs < n
        grad = tl.load(dy + offs, mask=mask, other=0.0).to(tl.float32)
        g = tl.load(gate + offs, mask=mask, other=0.0).to(tl.float32)
        u = tl.load(up + offs, mask=mask, other=0.0).to(tl.float32)
        s = tl.sigmoid(g)
        tl.store(d_up + offs, grad * (g * s), mask=mask)
        tl.store(d_gate + offs, grad * u * s * (1.0 + g * (1.0 - s)), mask=mask)

    @triton.jit
    def rope(
        src, s_b, s_h, s_t, dst, d_b, d_h, d_t, cos, sin, c_b, c_t, heads, steps, half,
        heads_block: tl.constexpr, half_block: tl.constexpr, transposed: tl.constexpr,
    ):  # fmt: skip
        pid = tl.program_id(0).to(tl.int64)
        b = pid // steps
        t = pid % steps
        hs = tl.arange(0, heads_block)[:, None]
        ds = tl.arange(0, half_block)[None, :]
        angle_mask = ds < half
        mask = (hs < heads) & angle_mask
        angles = b * c_b + t * c_t + ds
        c1 = tl.load(cos + angles, mask=angle_mask, other=0.0)
        c2 = tl.load(cos + angles + half, mask=angle_mask, other=0.0)
        s1 = tl.load(sin + angles, mask=angle_mask, other=0.0)
        s2 = tl.load(sin + angles + half, mask=angle_mask, other=0.0)
        at = src + b * s_b + hs * s_h + t * s_t + ds
        x1 = tl.load(at, mask=mask, other=0.0).to(tl.float32)
        x2 = tl.load(at + half, mask=mask, other=0.0).to(tl.float32)
        if transposed:  # the gradient: the rotation's transpose
            y1 = x1 * c1 + x2 * s2
            y2 = x2 * c2 - x1 * s1
        else:
            y1 = x1 * c1 - x2 * s1
            y2 = x2 * c2 + x1 * s2
        out = dst + b * d_b + hs * d_h + t * d_t + ds
        tl.store(out, y1, mask=mask)
        tl.store(out + half, y2, mask=mask)

    return Kernels(rms_forward, rms_backward, swiglu_forward, swiglu_backward, rope)


def _ready() -> Kernels:
    found = kernels()
    assert found is not None, "Triton kernels are used only where Triton is installed"
    return found


def _pow2(n: int) -> int:
    return 1 << max(n - 1, 0).bit_length()


def _warps(block: int) -> int:
    """Warps for a program holding one row of `block` elements: about eight fp32 values a
    thread, at least four warps and at most 32."""
    return min(32, max(4, block // 256))


@functools.cache
def _processors(device: torch.device) -> int:
    """Programs of the RMSNorm backward (each sums its rows' weight gradient): one per SM."""
    if device.type == "cuda":
        return int(torch.cuda.get_device_properties(device).multi_processor_count)
    return 4


class RMSNorm(torch.autograd.Function):
    """y = w * (x / rms(x)), statistics in fp32, y in x's dtype (the module docstring's rules)."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
        cols = x.shape[-1]
        rows2d = x.reshape(-1, cols)
        if rows2d.stride(-1) != 1:
            rows2d = rows2d.contiguous()
        n = rows2d.shape[0]
        y = torch.empty((n, cols), dtype=x.dtype, device=x.device)
        rstd = torch.empty(n, dtype=torch.float32, device=x.device)
        block = _pow2(cols)
        if n:
            _ready().rms_forward[(n,)](
                rows2d, rows2d.stride(0), weight, y, rstd, cols, eps, block=block,
                num_warps=_warps(block),
            )  # fmt: skip
        ctx.save_for_backward(rows2d, weight, rstd)
        ctx.shape = x.shape
        return y.view(x.shape)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None, None]:
        x, weight, rstd = ctx.saved_tensors
        n, cols = x.shape
        dy = grad.reshape(n, cols).contiguous()
        dx = torch.empty((n, cols), dtype=x.dtype, device=x.device)
        want_dw = bool(ctx.needs_input_grad[1])
        programs = max(1, min(n, _processors(x.device)))
        parts = torch.empty(
            (programs, cols) if want_dw else (1,), dtype=torch.float32, device=x.device
        )
        block = _pow2(cols)
        if n:
            _ready().rms_backward[(programs,)](
                dy, x, x.stride(0), weight, rstd, dx, parts, n, cols, programs,
                block=block, want_dw=want_dw, num_warps=_warps(block),
            )  # fmt: skip
        grad_w = parts.sum(0).to(weight.dtype) if want_dw else None
        if want_dw and not n:
            grad_w = torch.zeros_like(weight)
        return dx.view(ctx.shape), grad_w, None


def _swiglu_grid(n: int) -> tuple[int]:
    return ((n + ELEMENTS - 1) // ELEMENTS,)


class SwiGLU(torch.autograd.Function):
    """silu(gate) * up; gate and up kept, the activation recomputed in backward."""

    @staticmethod
    def forward(ctx: Any, gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
        gate, up = gate.contiguous(), up.contiguous()
        out = torch.empty_like(gate)
        n = gate.numel()
        if n:
            _ready().swiglu_forward[_swiglu_grid(n)](gate, up, out, n, block=ELEMENTS)
        ctx.save_for_backward(gate, up)
        return out

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        gate, up = ctx.saved_tensors
        dy = grad.contiguous()
        d_gate, d_up = torch.empty_like(gate), torch.empty_like(up)
        n = gate.numel()
        if n:
            _ready().swiglu_backward[_swiglu_grid(n)](dy, gate, up, d_gate, d_up, n, block=ELEMENTS)
        return d_gate, d_up


def _angle_strides(cos: torch.Tensor) -> tuple[int, int]:
    """(row, position) strides of `[T, D]` angles (one set for every row) or `[B, 1, T, D]`."""
    if cos.dim() == 2:
        return 0, cos.stride(0)
    return cos.stride(0), cos.stride(2)


def _rotate(
    x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, transposed: bool
) -> torch.Tensor:
    """`[B, H, T, D]` heads (any strides with the last one 1) rotated into a fresh tensor of the
    same layout."""
    if x.stride(-1) != 1:
        x = x.contiguous()
    out = torch.empty_like(x)
    b, heads, steps, dim = x.shape
    half = dim // 2
    c_b, c_t = _angle_strides(cos)
    if x.numel():
        _ready().rope[(b * steps,)](
            x, x.stride(0), x.stride(1), x.stride(2),
            out, out.stride(0), out.stride(1), out.stride(2),
            cos, sin, c_b, c_t, heads, steps, half,
            heads_block=_pow2(heads), half_block=_pow2(half), transposed=transposed,
        )  # fmt: skip
    return out


class Rope(torch.autograd.Function):
    """Queries and keys rotated by the fp32 angles; only the angles kept for backward."""

    @staticmethod
    def forward(
        ctx: Any, q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        cos, sin = cos.contiguous(), sin.contiguous()
        ctx.save_for_backward(cos, sin)
        return _rotate(q, cos, sin, False), _rotate(k, cos, sin, False)

    @staticmethod
    def backward(
        ctx: Any, grad_q: torch.Tensor, grad_k: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, None, None]:
        cos, sin = ctx.saved_tensors
        return _rotate(grad_q, cos, sin, True), _rotate(grad_k, cos, sin, True), None, None


def rope(
    q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """`[B, H, T, D]` queries and keys rotated by `[T, D]` or `[B, 1, T, D]` fp32 angles."""
    return cast(tuple[torch.Tensor, torch.Tensor], Rope.apply(q, k, cos, sin))

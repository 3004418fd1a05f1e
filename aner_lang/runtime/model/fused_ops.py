"""RMSNorm and SwiGLU as one autograd function each, keeping only their inputs for backward, and
on CUDA the rotary position embedding of queries and keys as one kernel.

Written as plain torch ops, a half-precision RMSNorm keeps four tensors of the residual's size for
backward (its fp32 copy of the input among them) and SwiGLU keeps the activation `silu(gate)` as
well as both inputs. At an 8B model's size that is about 6 GB of a 32-layer step's activations.
These functions keep the input (and the norm's per-row 1/rms, one fp32 number per token) and
recompute the rest in backward.

Arithmetic: forward and backward compute in fp32 from the half-precision input and round the
result once; the gradients are the analytic ones, not autograd's decomposition, so they differ
from it in the last bits. They run only under half precision: float32 keeps the decomposed ops
(`transformer.RMSNorm`, `LlamaMLP`), the reference arithmetic.

On CUDA with Triton (it comes with torch's CUDA builds) the same two functions, and the rotary
position embedding of queries and keys, run as Aner's Triton kernels (`triton_ops`): one kernel
per direction instead of a dozen elementwise passes over fp32 copies, with the same arithmetic
(fp32 statistics, the normalised input rounded to the input's dtype before the weight as HF's
Llama does, `silu` rounded before the product) and the same saved tensors. Triton's fp32
exponential and summation order differ from torch's in the last fp32 bits, which can show after
rounding to the half dtype, so which implementation ran is part of the run's identity
(`implementation()`).

RoPE (`rope`) is the Triton kernel on CUDA under half precision and None elsewhere (the caller
then rotates with plain ops, `transformer.apply_rope`). The kernel rotates in the angles' dtype,
fp32 here, and rounds once, where the plain ops round the angles to the half dtype and every
product: the two agree up to the half-precision rounding of the result.
"""

from __future__ import annotations

import importlib.metadata
from typing import Any, cast

import torch
import torch.nn.functional as F

from aner_lang.runtime.model import triton_ops


class _RMSNorm(torch.autograd.Function):
    """y = w * (x / rms(x)), statistics in fp32, y in x's dtype."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
        h = x.float()
        rstd = torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)
        ctx.save_for_backward(x, weight, rstd)
        return (weight * (h * rstd).to(x.dtype)).to(x.dtype)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None, None]:
        x, weight, rstd = ctx.saved_tensors
        h = x.float()
        normed = h * rstd
        g = grad.float() * weight.float()
        # d/dx of x * rstd(x): rstd * (g - normed * mean(g * normed))
        grad_x = rstd * (g - normed * (g * normed).mean(-1, keepdim=True))
        grad_w = None
        if ctx.needs_input_grad[1]:
            dims = tuple(range(grad.dim() - 1))
            grad_w = (grad.float() * normed.to(x.dtype).float()).sum(dims).to(weight.dtype)
        return grad_x.to(x.dtype), grad_w, None


class _SwiGLU(torch.autograd.Function):
    """silu(gate) * up, the activation recomputed in backward."""

    @staticmethod
    def forward(ctx: Any, gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
        ctx.save_for_backward(gate, up)
        return F.silu(gate) * up

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        gate, up = ctx.saved_tensors
        g = gate.float()
        sig = torch.sigmoid(g)
        silu = g * sig
        grad_f = grad.float()
        grad_up = (grad_f * silu).to(up.dtype)
        grad_gate = (grad_f * up.float() * sig * (1 + g * (1 - sig))).to(gate.dtype)
        return grad_gate, grad_up


def _triton(x: torch.Tensor) -> bool:
    """Whether `x`'s functions run as the Triton kernels: on CUDA, where Triton is installed."""
    return x.is_cuda and triton_ops.kernels() is not None


def implementation(device: torch.device) -> str:
    """Which implementation the half-precision functions take on `device`:
    `triton-<version>:rms_norm,swiglu,rope` (Aner's kernels, compiled by that Triton) or `torch`
    (the functions are named, so a run that used fewer of the kernels has another identity)."""
    if device.type == "cuda" and triton_ops.kernels() is not None:
        return "triton-" + importlib.metadata.version("triton") + ":rms_norm,swiglu,rope"
    return "torch"


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    norm = triton_ops.RMSNorm if _triton(x) else _RMSNorm
    return cast(torch.Tensor, norm.apply(x, weight, eps))


def swiglu(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    function = triton_ops.SwiGLU if _triton(gate) else _SwiGLU
    return cast(torch.Tensor, function.apply(gate, up))


def rope(
    q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor] | None:
    """`[B, H, T, D]` queries and keys rotated by the fp32 angles (`[T, D]`, or `[B, 1, T, D]`)
    in one kernel per direction: on CUDA with Triton under half precision; None elsewhere."""
    if q.dtype == torch.float32 or not _triton(q):
        return None
    return triton_ops.rope(q, k, cos, sin)

"""Aner's Triton kernels for RMSNorm, SwiGLU and RoPE, run on the CPU by Triton's interpreter
(`TRITON_INTERPRET=1`) and compared, forward and gradients, with the torch functions of
`fused_ops` and the plain rotation of `transformer.apply_rope`.

Tolerances: float32 inputs agree to fp32 rounding (the kernels' sums run in another order);
float16 results agree to one unit in the last place of the fp16 result (the same fp32 value
rounded once, up to the sum order). Triton 3.9's interpreter converts fp32 to bfloat16 by
truncation where CUDA rounds to nearest, so a bfloat16 result may differ by one bf16 unit per
rounding it went through (two in the forward of RMSNorm, before and after the weight, and of
SwiGLU, the activation and the product), and RMSNorm's weight gradient, a sum over rows, by one
unit of each row's term. The GPU's own rounding
is checked against Liger's kernels in `test_fused_ops.py` (CUDA only)."""

from __future__ import annotations

import os

import pytest
import torch

from aner_lang.runtime.model import fused_ops, triton_ops
from aner_lang.runtime.model.transformer import apply_rope
from aner_lang.testing.saved import saved_bytes

pytest.importorskip("triton")
pytestmark = pytest.mark.skipif(
    os.environ.get("TRITON_INTERPRET") != "1",
    reason="Triton's interpreter is off (tests/conftest.py turns it on where there is no GPU)",
)

DTYPES = [torch.float32, torch.float16, torch.bfloat16]
ULP = {torch.float32: 2.0**-23, torch.float16: 2.0**-10, torch.bfloat16: 2.0**-7}
"""The spacing of a dtype's numbers relative to the power of two below them."""


@pytest.fixture(autouse=True)
def interpreted(monkeypatch, tmp_path):
    """Triton's cache in a scratch folder, the kernels defined afresh for each test."""
    monkeypatch.setenv("ANER_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.delenv("TRITON_CACHE_DIR", raising=False)
    triton_ops.kernels.cache_clear()
    yield
    triton_ops.kernels.cache_clear()


def _close(ours: torch.Tensor, ref: torch.Tensor, units: float) -> None:
    """`ours` within `units` of the dtype's last place of `ref` (relative), or of its largest
    magnitude's last place for entries near zero."""
    dtype = ref.dtype
    tol = units * ULP[dtype]
    scale = ref.float().abs().amax().item()
    torch.testing.assert_close(ours.float(), ref.float(), rtol=tol, atol=tol * scale * 2**-6)


def _rounding_units(dtype: torch.dtype, bf16: float) -> float:
    """One unit of the half dtype's rounding, `bf16` under the interpreter's truncation; float32
    allows for the reordered fp32 sums."""
    return {torch.float32: 64.0, torch.float16: 1.0, torch.bfloat16: bf16}[dtype]


@pytest.mark.parametrize("dtype", DTYPES)
def test_rms_norm_kernel_matches_the_torch_function(dtype):
    gen = torch.Generator().manual_seed(0)
    # [T, B, C] seen as [B, T, C]: rows that are not contiguous; C not a power of two
    base = (torch.randn(7, 3, 96, generator=gen) * 3).to(dtype)
    x = base.transpose(0, 1).requires_grad_(True)
    x_ref = base.transpose(0, 1).detach().clone().requires_grad_(True)
    w = (1 + 0.1 * torch.randn(96, generator=gen)).requires_grad_(True)
    w_ref = w.detach().clone().requires_grad_(True)
    g = torch.randn(3, 7, 96, generator=gen).to(dtype)
    ours = triton_ops.RMSNorm.apply(x, w, 1e-5)
    ref = fused_ops._RMSNorm.apply(x_ref, w_ref, 1e-5)
    assert ours.shape == ref.shape and ours.dtype == dtype
    _close(ours, ref, _rounding_units(dtype, 2.0))  # rounded before the weight and after
    gx, gw = torch.autograd.grad(ours, (x, w), g)
    rx, rw = torch.autograd.grad(ref, (x_ref, w_ref), g)
    assert gx.dtype == dtype and gw.dtype == torch.float32
    _close(gx, rx, _rounding_units(dtype, 1.0))
    # each row adds dy * round(x * rstd): a rounding difference of one unit per row at most
    h = x.detach().float()
    normed = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + 1e-5)
    per_row = (g.float().abs() * normed.abs()).sum((0, 1)) * ULP[dtype]
    assert ((gw - rw).abs() <= per_row * _rounding_units(dtype, 1.0) + 1e-6).all()
    # the weight frozen (as in training an adapter): no weight gradient, the same input gradient
    (gx_frozen,) = torch.autograd.grad(triton_ops.RMSNorm.apply(x, w.detach(), 1e-5), (x,), g)
    assert torch.equal(gx_frozen, gx)


@pytest.mark.parametrize("dtype", DTYPES)
def test_swiglu_kernel_matches_the_torch_function(dtype):
    gen = torch.Generator().manual_seed(1)
    # 3 * 700 elements: two full blocks of the kernel and a partial one
    gate = (torch.randn(3, 700, generator=gen) * 3).to(dtype).requires_grad_(True)
    up = torch.randn(3, 700, generator=gen).to(dtype).requires_grad_(True)
    g = torch.randn(3, 700, generator=gen).to(dtype)
    gate_before, up_before = gate.detach().clone(), up.detach().clone()
    ours = triton_ops.SwiGLU.apply(gate, up)
    ref = fused_ops._SwiGLU.apply(gate, up)
    _close(ours, ref, _rounding_units(dtype, 2.0))
    mine = torch.autograd.grad(ours, (gate, up), g)
    theirs = torch.autograd.grad(ref, (gate, up), g)
    for a, b in zip(mine, theirs):
        assert a.dtype == dtype
        _close(a, b, _rounding_units(dtype, 1.0))
    assert torch.equal(gate.detach(), gate_before) and torch.equal(up.detach(), up_before)


def _angles(positions: torch.Tensor, dim: int) -> tuple[torch.Tensor, torch.Tensor]:
    inv = 1.0 / 10000 ** (torch.arange(0, dim, 2).float() / dim)
    emb = positions.float()[..., None] * inv
    emb = torch.cat([emb, emb], dim=-1)
    return emb.cos(), emb.sin()


@pytest.mark.parametrize("per_row", [False, True])
@pytest.mark.parametrize("dtype", DTYPES)
def test_rope_kernel_rotates_once_in_fp32_as_the_plain_ops_do(dtype, per_row):
    """Queries and keys (fewer key heads, `[B, T, H, D]` projections seen as `[B, H, T, D]`, a
    head size whose half is not a power of two) rotated by angles per position or per row: the
    plain rotation of the fp32 values, rounded once; gradients likewise; inputs left as they
    were."""
    gen = torch.Generator().manual_seed(4)
    b, t, d = 2, 9, 80
    q = torch.randn(b, t, 6, d, generator=gen).to(dtype).transpose(1, 2).requires_grad_(True)
    k = torch.randn(b, t, 2, d, generator=gen).to(dtype).transpose(1, 2).requires_grad_(True)
    positions = torch.arange(t).repeat(b, 1) + torch.tensor([[0], [5]]) if per_row else None
    cos, sin = _angles(positions if per_row else torch.arange(t), d)
    if per_row:
        cos, sin = cos[:, None], sin[:, None]
    before = (q.detach().clone(), k.detach().clone())
    rotated = triton_ops.rope(q, k, cos, sin)
    q32, k32 = (x.detach().float().requires_grad_(True) for x in (q, k))
    plain = (apply_rope(q32, cos, sin), apply_rope(k32, cos, sin))
    for ours, ref, x in zip(rotated, plain, (q, k)):
        assert ours.shape == x.shape and ours.dtype == dtype and ours.stride() == x.stride()
        _close(ours, ref.to(dtype), _rounding_units(dtype, 1.0))
    assert torch.equal(q.detach(), before[0]) and torch.equal(k.detach(), before[1])
    gq = torch.randn(q.shape, generator=gen).to(dtype)
    gk = torch.randn(k.shape, generator=gen).to(dtype)
    mine = torch.autograd.grad(rotated, (q, k), (gq, gk))
    theirs = torch.autograd.grad(plain, (q32, k32), (gq.float(), gk.float()))
    for a, r in zip(mine, theirs):
        assert a.dtype == dtype
        _close(a, r.to(dtype), _rounding_units(dtype, 1.0))


def test_the_kernels_keep_only_their_inputs_and_the_norm_statistics():
    """RMSNorm keeps x and one fp32 number a row; SwiGLU keeps gate and up; RoPE only the
    angles."""
    x = torch.randn(4, 5, 64).bfloat16().requires_grad_(True)
    w = torch.ones(64)
    assert saved_bytes(lambda: triton_ops.RMSNorm.apply(x, w, 1e-5)) == (
        x.numel() * 2 + w.numel() * 4 + 20 * 4
    )
    gate, up = (torch.randn(3, 40).bfloat16().requires_grad_(True) for _ in range(2))
    assert saved_bytes(lambda: triton_ops.SwiGLU.apply(gate, up)) == 2 * gate.numel() * 2
    q = torch.randn(1, 4, 5, 16).bfloat16().requires_grad_(True)
    cos, sin = _angles(torch.arange(5), 16)
    assert saved_bytes(lambda: triton_ops.rope(q, q[:, :2], cos, sin)) == 2 * cos.numel() * 4


def test_the_kernels_compile_into_aners_versioned_triton_cache(tmp_path, monkeypatch):
    """Defining the kernels points Triton at `$ANER_CACHE_DIR/triton/<version>`, unless the
    user set `TRITON_CACHE_DIR`."""
    import triton

    assert triton_ops.kernels() is not None
    expected = tmp_path / "cache" / "triton" / triton.__version__
    assert os.environ["TRITON_CACHE_DIR"] == str(expected)
    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path / "mine"))
    triton_ops.kernels.cache_clear()
    assert triton_ops.kernels() is not None
    assert os.environ["TRITON_CACHE_DIR"] == str(tmp_path / "mine")

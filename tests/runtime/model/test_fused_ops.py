"""The half-precision RMSNorm and SwiGLU functions: the forward of the plain ops, their
analytic gradients, and less kept for backward; on CUDA, Aner's Triton kernels for them and for
RoPE, checked against the torch functions and against Liger's kernels (which they replaced)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from aner_lang.runtime.model import fused_ops
from aner_lang.runtime.model.fused_ops import rms_norm, swiglu
from aner_lang.runtime.model.transformer import apply_rope
from aner_lang.testing.saved import saved_bytes


def _plain_norm(x, w, eps):
    h = x.float()
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)
    return (w * h.to(x.dtype)).to(x.dtype)


def test_rms_norm_forward_is_the_plain_ops_and_gradients_match_autograd():
    gen = torch.Generator().manual_seed(0)
    x = (torch.randn(3, 7, 64, generator=gen) * 3).requires_grad_(True)
    w = (1 + 0.1 * torch.randn(64, generator=gen)).requires_grad_(True)
    g = torch.randn(3, 7, 64, generator=gen)
    ours = rms_norm(x, w, 1e-5)
    ref = _plain_norm(x, w, 1e-5)
    assert torch.equal(ours, ref)
    gx, gw = torch.autograd.grad(ours, (x, w), g)
    rx, rw = torch.autograd.grad(ref, (x, w), g)
    assert torch.allclose(gx, rx, rtol=1e-5, atol=1e-6) and torch.allclose(gw, rw, rtol=1e-5)
    xb = x.detach().to(torch.bfloat16).requires_grad_(True)
    assert torch.equal(rms_norm(xb, w.detach(), 1e-5), _plain_norm(xb, w.detach(), 1e-5))
    kept = saved_bytes(lambda: rms_norm(xb, w.detach(), 1e-5))
    assert kept < saved_bytes(lambda: _plain_norm(xb, w.detach(), 1e-5)) / 3


def test_swiglu_gradients_match_autograd_and_keep_only_the_inputs():
    gen = torch.Generator().manual_seed(1)
    gate = (torch.randn(5, 96, generator=gen) * 2).requires_grad_(True)
    up = torch.randn(5, 96, generator=gen).requires_grad_(True)
    g = torch.randn(5, 96, generator=gen)
    ours = swiglu(gate, up)
    ref = F.silu(gate) * up
    assert torch.allclose(ours, ref)
    for a, b in zip(
        torch.autograd.grad(ours, (gate, up), g), torch.autograd.grad(ref, (gate, up), g)
    ):
        assert torch.allclose(a, b, rtol=1e-5, atol=1e-6)
    gb, ub = (t.detach().to(torch.bfloat16).requires_grad_(True) for t in (gate, up))
    assert saved_bytes(lambda: swiglu(gb, ub)) == 2 * gb.numel() * gb.element_size()


@pytest.mark.cuda
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_triton_kernels_on_cuda_agree_with_the_torch_functions(dtype):
    """On CUDA the half-precision functions are Aner's Triton kernels: forward and gradients
    equal the torch functions' up to the half-precision rounding of the result (Triton's fp32
    exponential and the mean's summation order differ in the last fp32 bits, which a rounding to
    fp16 can show)."""
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    if fused_ops.implementation(torch.device("cuda")) == "torch":
        pytest.skip("Triton is not installed")
    gen = torch.Generator(device="cuda").manual_seed(3)
    x = (torch.randn(4, 33, 512, generator=gen, device="cuda") * 3).to(dtype).requires_grad_(True)
    w = 1 + 0.1 * torch.randn(512, generator=gen, device="cuda")
    g = torch.randn(4, 33, 512, generator=gen, device="cuda").to(dtype)
    ours = fused_ops.rms_norm(x, w, 1e-5)
    ref = fused_ops._RMSNorm.apply(x, w, 1e-5)
    assert ours.dtype == dtype and torch.allclose(ours.float(), ref.float(), rtol=1e-2, atol=1e-2)
    (gx,) = torch.autograd.grad(ours, (x,), g)
    (rx,) = torch.autograd.grad(ref, (x,), g)
    assert torch.allclose(gx.float(), rx.float(), rtol=2e-2, atol=2e-2)

    gate = (torch.randn(65, 700, generator=gen, device="cuda") * 2).to(dtype).requires_grad_(True)
    up = torch.randn(65, 700, generator=gen, device="cuda").to(dtype).requires_grad_(True)
    gc = torch.randn(65, 700, generator=gen, device="cuda").to(dtype)
    gate2, up2 = (t.detach().clone().requires_grad_(True) for t in (gate, up))
    ours = fused_ops.swiglu(gate, up)
    ref = fused_ops._SwiGLU.apply(gate2, up2)
    assert torch.allclose(ours.float(), ref.float(), rtol=1e-2, atol=1e-3)
    theirs = torch.autograd.grad(ref, (gate2, up2), gc)
    mine = torch.autograd.grad(ours, (gate, up), gc)
    for a, b in zip(mine, theirs):
        assert torch.allclose(a.float(), b.float(), rtol=2e-2, atol=2e-2)


def test_rope_is_left_to_the_plain_ops_off_cuda_and_under_float32():
    q, k = torch.randn(1, 4, 5, 8), torch.randn(1, 2, 5, 8)
    cos, sin = torch.randn(5, 8), torch.randn(5, 8)
    assert fused_ops.rope(q.bfloat16(), k.bfloat16(), cos, sin) is None
    if torch.cuda.is_available():
        assert fused_ops.rope(q.cuda(), k.cuda(), cos.cuda(), sin.cuda()) is None


@pytest.mark.cuda
@pytest.mark.parametrize("per_row", [False, True])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_triton_rope_agrees_with_the_plain_ops_and_leaves_its_inputs(dtype, per_row):
    """The Triton RoPE rotates queries and keys (GQA: fewer key heads; angles per position or per
    row of a packed batch) as the plain ops do, up to the half-precision rounding of the result,
    and its gradients likewise; the tensors it was given are not changed."""
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    if fused_ops.implementation(torch.device("cuda")) == "torch":
        pytest.skip("Triton is not installed")
    gen = torch.Generator(device="cuda").manual_seed(4)
    b, t, d = 2, 37, 64
    # [B, T, H, D] projections seen as [B, H, T, D], as the attention makes them
    q = torch.randn(b, t, 8, d, generator=gen, device="cuda").to(dtype).transpose(1, 2)
    k = torch.randn(b, t, 2, d, generator=gen, device="cuda").to(dtype).transpose(1, 2)
    positions = torch.arange(t, device="cuda").repeat(b, 1) if per_row else torch.arange(t).cuda()
    inv = 1.0 / 10000 ** (torch.arange(0, d, 2, device="cuda").float() / d)
    emb = positions.float()[..., None] * inv
    emb = torch.cat([emb, emb], dim=-1)
    emb = emb[:, None] if per_row else emb
    cos, sin = emb.cos(), emb.sin()
    q_in, k_in = (x.detach().clone().requires_grad_(True) for x in (q, k))
    q_ref, k_ref = (x.detach().clone().requires_grad_(True) for x in (q, k))
    before = (q_in.detach().clone(), k_in.detach().clone())
    rotated = fused_ops.rope(q_in, k_in, cos, sin)
    assert rotated is not None
    plain = (apply_rope(q_ref, cos, sin), apply_rope(k_ref, cos, sin))
    for ours, ref in zip(rotated, plain):
        assert ours.shape == ref.shape and ours.dtype == dtype
        assert torch.allclose(ours.float(), ref.float(), rtol=2e-2, atol=2e-2)
    assert torch.equal(q_in.detach(), before[0]) and torch.equal(k_in.detach(), before[1])
    gq = torch.randn(q.shape, generator=gen, device="cuda").to(dtype)
    gk = torch.randn(k.shape, generator=gen, device="cuda").to(dtype)
    mine = torch.autograd.grad(rotated, (q_in, k_in), (gq.clone(), gk.clone()))
    theirs = torch.autograd.grad(plain, (q_ref, k_ref), (gq, gk))
    for a, r in zip(mine, theirs):
        assert torch.allclose(a.float(), r.float(), rtol=2e-2, atol=2e-2)


@pytest.mark.cuda
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_triton_kernels_match_liger_which_they_replaced(dtype):
    """Against liger-kernel 0.8.5 (llama casting mode, the previous path): the same arithmetic, so
    results within one unit of the half dtype's last place (rsqrt, exp and the sums' order may
    differ in the last fp32 bit), gradients included."""
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    liger_norm = pytest.importorskip("liger_kernel.ops.rms_norm").LigerRMSNormFunction
    liger_swiglu = pytest.importorskip("liger_kernel.ops.swiglu").LigerSiLUMulFunction
    liger_rope = pytest.importorskip("liger_kernel.ops.rope").LigerRopeFunction
    unit = {torch.bfloat16: 2.0**-7, torch.float16: 2.0**-10}[dtype]

    def close(a, b):
        torch.testing.assert_close(a.float(), b.float(), rtol=unit, atol=unit * 1e-2)

    def pair(*shape, scale=1.0):
        t = (torch.randn(*shape, generator=gen, device="cuda") * scale).to(dtype)
        return t.clone().requires_grad_(True), t.clone().requires_grad_(True)

    gen = torch.Generator(device="cuda").manual_seed(5)
    x, x_l = pair(4, 97, 2048, scale=3)
    w = 1 + 0.1 * torch.randn(2048, generator=gen, device="cuda")
    g = torch.randn(4, 97, 2048, generator=gen, device="cuda").to(dtype)
    ours, theirs = (
        fused_ops.rms_norm(x, w, 1e-5),
        liger_norm.apply(x_l, w, 1e-5, 0.0, "llama", False),
    )
    close(ours, theirs)
    close(torch.autograd.grad(ours, x, g)[0], torch.autograd.grad(theirs, x_l, g)[0])

    (gate, gate_l), (up, up_l) = pair(300, 5632, scale=2), pair(300, 5632)
    gc = torch.randn(300, 5632, generator=gen, device="cuda").to(dtype)
    ours, theirs = fused_ops.swiglu(gate, up), liger_swiglu.apply(gate_l, up_l)
    close(ours, theirs)
    for a, b in zip(
        torch.autograd.grad(ours, (gate, up), gc), torch.autograd.grad(theirs, (gate_l, up_l), gc)
    ):
        close(a, b)

    b, t, d = 2, 129, 128
    (q, q_l), (k, k_l) = pair(b, t, 32, d), pair(b, t, 8, d)
    q, q_l, k, k_l = (v.transpose(1, 2) for v in (q, q_l, k, k_l))
    inv = 1.0 / 10000 ** (torch.arange(0, d, 2, device="cuda").float() / d)
    emb = torch.arange(t, device="cuda").float()[:, None] * inv
    emb = torch.cat([emb, emb], dim=-1)
    cos, sin = emb.cos(), emb.sin()
    ours = fused_ops.rope(q, k, cos, sin)
    assert ours is not None
    theirs = liger_rope.apply(q_l.clone(), k_l.clone(), cos, sin)
    for a, r in zip(ours, theirs):
        close(a, r)
    gq = torch.randn(q.shape, generator=gen, device="cuda").to(dtype)
    gk = torch.randn(k.shape, generator=gen, device="cuda").to(dtype)
    mine = torch.autograd.grad(ours, (q, k), (gq, gk))
    ref = torch.autograd.grad(theirs, (q_l, k_l), (gq.clone(), gk.clone()))
    for a, r in zip(mine, ref):
        close(a, r)

"""The host_tiled NF4 matmul: bounded tiles, same numbers as dequantize-then-dense."""

from __future__ import annotations

import pytest
import torch

from aner_lang.problems.errors import AnerRuntimeError
from aner_lang.runtime.nf4 import host_tiled
from aner_lang.runtime.nf4.backends import HostTiled, nf4_matmul, resolve_kernel, using_backend
from aner_lang.runtime.nf4.linear import NF4Linear
from aner_lang.runtime.nf4.quant import dequantize_nf4, quantize_nf4


def _weight(n: int, k: int, seed: int = 0) -> torch.Tensor:
    return torch.randn(n, k, generator=torch.Generator().manual_seed(seed)) * 0.05


@pytest.mark.parametrize(
    "n,k,tile_bytes",
    [(576, 576, 8 << 20), (1536, 576, 64 * 576 * 4), (100, 96, 4 * 96), (37, 70, 1)],
)
def test_forward_and_backward_match_dense(n: int, k: int, tile_bytes: int) -> None:
    w = quantize_nf4(_weight(n, k))
    dense = dequantize_nf4(w)
    x = torch.randn(5, 3, k, generator=torch.Generator().manual_seed(1), requires_grad=True)
    y = nf4_matmul(x, w, HostTiled(tile_bytes))
    x_ref = x.detach().clone().requires_grad_(True)
    y_ref = x_ref @ dense.t()
    assert y.shape == (5, 3, n)
    assert torch.allclose(y, y_ref, rtol=1e-5, atol=1e-5)
    g = torch.randn_like(y)
    y.backward(g)
    y_ref.backward(g)
    assert torch.allclose(x.grad, x_ref.grad, rtol=1e-5, atol=1e-5)


def test_autocast_forward_in_its_dtype_backward_in_the_gradients() -> None:
    """Under a bfloat16 autocast the product runs on bfloat16 operands and comes back in the
    input's float32 unrounded; the backward (called outside autocast, as the trainer's is) runs in
    the gradient's float32."""
    w = quantize_nf4(_weight(96, 128))
    dense = dequantize_nf4(w)
    x = torch.randn(6, 128, generator=torch.Generator().manual_seed(2), requires_grad=True)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        y = nf4_matmul(x, w, HostTiled())
    assert y.dtype == torch.float32
    assert torch.equal(y, (x.detach().to(torch.bfloat16) @ dense.to(torch.bfloat16).t()).float())
    g = torch.randn(6, 96, generator=torch.Generator().manual_seed(3))
    y.backward(g)
    assert torch.allclose(x.grad, g @ dense, rtol=1e-5, atol=1e-6)


def test_tiles_stay_within_the_budget() -> None:
    w = quantize_nf4(_weight(1024, 256))
    budget = 64 * 256 * 4  # 64 rows of fp32
    assert host_tiled.tile_rows(w, budget) == 64
    host_tiled._scratch.clear()
    host_tiled.linear(torch.randn(4, 256), w, budget)
    assert all(b.numel() * b.element_size() <= budget for b in host_tiled._scratch.values())


def test_rows_dequantize_only_the_requested_rows() -> None:
    for k in (128, 70):
        w = quantize_nf4(_weight(50, k, seed=k))
        ids = torch.tensor([[3, 7, 3], [49, 0, 7]])
        assert torch.equal(host_tiled.rows(w, ids), dequantize_nf4(w)[ids])


def test_one_rule_for_auto_and_a_clear_error_where_fused_cannot_run() -> None:
    cpu = torch.device("cpu")
    assert resolve_kernel("auto", cpu) == "host_tiled"  # on a CPU model even where CUDA exists
    assert resolve_kernel("host_tiled", cpu) == "host_tiled"
    with pytest.raises(AnerRuntimeError, match="kernel: fused needs a CUDA GPU") as err:
        resolve_kernel("fused", cpu)
    assert err.value.code == "E-KERNEL-UNAVAILABLE"
    with pytest.raises(AnerRuntimeError, match="unknown NF4 kernel 'turbo'"):
        resolve_kernel("turbo", cpu)
    if not torch.cuda.is_available():
        assert resolve_kernel("auto", torch.device("cuda")) == "host_tiled"
        with pytest.raises(AnerRuntimeError, match="kernel: fused needs a CUDA GPU"):
            resolve_kernel("fused", torch.device("cuda"))


def test_a_run_scoped_backend_is_what_nf4_matmuls_take() -> None:
    """Inside `using_backend` every NF4 matmul takes that backend; outside, `auto`'s."""
    w = quantize_nf4(_weight(48, 64, seed=3))
    x = torch.randn(2, 64, generator=torch.Generator().manual_seed(1))
    seen = []

    class Recording(HostTiled):
        def linear(self, x, w):
            seen.append(self.tile_bytes)
            return super().linear(x, w)

    layer = NF4Linear(w)
    with using_backend(Recording(tile_bytes=4096)):
        inside = layer(x)
    outside = layer(x)
    assert seen == [4096] and not hasattr(layer, "kernel")
    assert torch.equal(inside, host_tiled.linear(x, w, 4096))
    assert torch.equal(outside, host_tiled.linear(x, w))


@pytest.mark.cuda
def test_host_tiled_runs_on_cuda_tensors_and_matches_the_cpu() -> None:
    if not torch.cuda.is_available():
        pytest.skip("no CUDA GPU")
    w = quantize_nf4(_weight(1536, 576))
    x = torch.randn(32, 576, generator=torch.Generator().manual_seed(2))
    budget = 256 * 576 * 4  # 6 tiles
    host_tiled._scratch.clear()
    w_gpu, x_gpu = w.to("cuda"), x.cuda().requires_grad_(True)
    y = nf4_matmul(x_gpu, w_gpu, HostTiled(budget))
    y.square().sum().backward()
    assert y.is_cuda and x_gpu.grad.is_cuda
    assert torch.equal(dequantize_nf4(w_gpu).cpu(), dequantize_nf4(w))  # same bits on both devices
    assert torch.allclose(y.cpu(), host_tiled.linear(x, w, budget), rtol=1e-4, atol=1e-4)
    assert torch.allclose(
        x_gpu.grad.cpu(),
        host_tiled.grad_input(2 * y.detach().cpu(), w, budget),
        rtol=1e-4,
        atol=1e-4,
    )
    cuda_buffers = [b for (dev, _), b in host_tiled._scratch.items() if dev.type == "cuda"]
    assert cuda_buffers and all(b.numel() * 4 <= budget for b in cuda_buffers)

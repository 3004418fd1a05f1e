"""The fused backend's path rules, checked without a GPU: which kernel and block shape a shape gets.

The rules encode H200 measurements (ops' docstring); these tests pin the decisions those
measurements support, so a change to a threshold is a deliberate one.
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from aner_lang.runtime.nf4.fused import ops  # noqa: E402

H200_SMS = 132


class _Hopper:
    has_wgmma = True


@pytest.fixture
def hopper(monkeypatch) -> torch.device:
    monkeypatch.setattr(ops, "sm_count", lambda index: H200_SMS)
    monkeypatch.setattr(ops, "device_index", lambda device: 0)
    monkeypatch.setattr(ops, "_module", lambda device: _Hopper())
    return torch.device("cuda", 0)


@pytest.mark.parametrize(
    "n,k,m,shape",
    [
        (
            4096,
            4096,
            512,
            (256, 64, 1),
        ),  # 128 blocks: 35 us; 256x128 (64 blocks) 58 us; k split only from 8192
        (4096, 14336, 512, (256, 128, 2)),  # 64 clusters of 2: 110 us against 120 for 256x64
        (14336, 4096, 512, (256, 128, 1)),  # 112 blocks
        (4096, 4096, 1024, (256, 128, 1)),
        (4096, 4096, 256, (128, 64, 1)),  # 256-token tiles would leave too few blocks
        (4096, 14336, 256, (128, 128, 2)),  # 74 us against 79 for 128x64
        (4096, 4096, 128, (128, 64, 1)),  # no shape reaches 0.75 blocks per SM: the most blocks
        (14336, 4096, 128, (128, 128, 1)),
    ],
)
def test_tma_block_shape(
    hopper: torch.device, n: int, k: int, m: int, shape: tuple[int, int, int]
) -> None:
    assert ops.tma_kernel(m, n, k, hopper) == shape


@pytest.mark.parametrize(
    "m,n,k,path",
    [
        (512, 4096, 4096, "fused-tma"),
        (512, 4096, 14336, "fused-tma"),
        (1024, 4096, 4096, "fused-tma"),
        (
            1025,
            4096,
            4096,
            "dequant+cublas",
        ),  # cuBLAS on the dequantized weight wins from here (4096: 213 us vs 249)
        (128, 49152, 576, "fused-wgmma-ws"),  # 9 k-steps: too few for the copy pipeline
        (900, 576, 1536, "dequant+cublas"),  # SmolLM2's down projection: a small weight, 24 k-steps
        (512, 4096, 2048, "dequant+cublas"),  # fewer k-steps than any shape the TMA kernel won on
        (128, 2048, 4096, "dequant+cublas"),  # 32 blocks: a grid the TMA kernel was not measured on
        (
            64,
            14336,
            4096,
            "fused-tma",
        ),  # up to 64 tokens only on weights wide enough for a fused GEMM
        (32, 4096, 4096, "dequant+cublas"),
        (32, 49152, 576, "fused-wgmma"),
    ],
)
def test_many_token_paths(hopper: torch.device, m: int, n: int, k: int, path: str) -> None:
    assert ops.path(m, torch.bfloat16, hopper, n, k) == path
    assert ops.path(m, torch.float32, hopper, n, k) == "dequant+cublas"

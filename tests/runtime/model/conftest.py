"""Fixtures shared by the model tests."""

from __future__ import annotations

import pytest
import torch


@pytest.fixture(
    params=[
        "cpu",
        pytest.param(
            "cuda",
            marks=[
                pytest.mark.cuda,
                pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
            ],
        ),
    ]
)
def device(request: pytest.FixtureRequest) -> str:
    """Each device a test runs on: the CPU, and CUDA where there is a GPU (a `cuda` test)."""
    return str(request.param)

"""Helpers shared by the checkpoint and export tests."""

from __future__ import annotations

import pytest
import torch


def _trained_like(adapter, seed: int = 3):
    """Give every trainable tensor non-trivial values, as training would (B starts at zero)."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in adapter.params.values():
            p.add_(torch.randn(p.shape, generator=g) * 0.05)
    return adapter


@pytest.fixture(autouse=True)
def _cache(tmp_path, monkeypatch):
    """Fingerprints go to a per-test cache, never the user's."""
    monkeypatch.setenv("ANER_CACHE_DIR", str(tmp_path / "cache"))


@pytest.fixture
def trained_like():
    return _trained_like

"""model/host_copies: offload's copies in pinned host memory, and how that memory is pinned."""

from __future__ import annotations

import pytest
import torch

from aner_lang.runtime.model import host_copies

PINNINGS = [
    ("", host_copies.PINNING),
    ("expandable_segments:True", "expandable_segments:True," + host_copies.PINNING),
    ("pinned_use_cuda_host_register:False", "pinned_use_cuda_host_register:False"),
]
"""The allocator settings a process has before offload's host copies, and after."""


@pytest.mark.skipif(
    not hasattr(torch._C, "_accelerator_getAllocatorSettings"), reason="torch before 2.12"
)
@pytest.mark.parametrize(("before", "after"), PINNINGS)
def test_offload_pins_by_registering_pages_and_keeps_the_users_settings(before, after):
    """Host copies switch torch's pinning to registered pages once, after the settings the
    process has, and never over a pinning the user chose."""
    torch._C._accelerator_setAllocatorSettings(before)
    host_copies.register_pinned_pages.cache_clear()
    try:
        host_copies.HostCopies()
        assert torch._C._accelerator_getAllocatorSettings() == after
        torch._C._accelerator_setAllocatorSettings(before)
        host_copies.HostCopies()  # once a process: settings changed since stay as they are
        assert torch._C._accelerator_getAllocatorSettings() == before
    finally:
        torch._C._accelerator_setAllocatorSettings("")
        host_copies.register_pinned_pages.cache_clear()


@pytest.mark.parametrize("variable", ["PYTORCH_ALLOC_CONF", "PYTORCH_CUDA_ALLOC_CONF"])
@pytest.mark.parametrize(("before", "after"), PINNINGS)
def test_a_torch_that_cannot_tell_its_settings_keeps_the_environments(
    before, after, variable, monkeypatch
):
    """Where torch cannot say its settings (2.11), those of the environment go first."""
    put: list[str] = []
    monkeypatch.delattr(torch._C, "_accelerator_getAllocatorSettings", raising=False)
    monkeypatch.setattr(torch._C, "_accelerator_setAllocatorSettings", put.append)
    for name in ("PYTORCH_ALLOC_CONF", "PYTORCH_CUDA_ALLOC_CONF"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv(variable, before)
    host_copies.register_pinned_pages.cache_clear()
    try:
        host_copies.HostCopies()
    finally:
        host_copies.register_pinned_pages.cache_clear()
    assert put == ([after] if after != before else [])


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_a_host_copy_comes_back_in_the_layout_it_was_saved_in():
    """A transposed view (as a matmul saves one) goes to the host and comes back with its
    strides: backward multiplies the same layout, so it takes the same kernels."""
    copies = host_copies.HostCopies()
    saved = torch.arange(12.0, device="cuda").view(3, 4).t()
    packed = copies.pack(saved)
    assert packed.host.is_pinned() and packed.host.stride() == saved.stride()
    back = copies.unpack(packed)
    assert back.stride() == saved.stride() and torch.equal(back, saved)

"""model/host_copies: offload's copies in pinned host memory and back."""

from __future__ import annotations

import pytest
import torch

from aner_lang.runtime.model import host_copies, pinned_blocks


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_a_host_copy_comes_back_in_the_layout_it_was_saved_in():
    """A transposed view (as a matmul saves one) goes to the host and comes back with its
    strides: backward multiplies the same layout, so it takes the same kernels."""
    copies = host_copies.HostCopies()
    saved = torch.arange(12.0, device="cuda").view(3, 4).t()
    before = pinned_blocks.pinned_bytes(saved.device)
    packed = copies.pack(saved)
    assert packed.host.is_pinned() and packed.host.stride() == saved.stride()
    assert pinned_blocks.pinned_bytes(saved.device) - before in (0, 48)  # exact, or a free block
    back = copies.unpack(packed)
    assert back.stride() == saved.stride() and torch.equal(back, saved)

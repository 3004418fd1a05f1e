"""model/pinned_blocks: pinned host tensors at exactly their bytes, handed out again in turn.

On this CPU machine `cudaHostRegister` is a recorder: the pool's rules (sizes, layouts, reuse,
what it counts) are the same on both; the CUDA test of test_activations pins for real."""

from __future__ import annotations

from collections import defaultdict
from types import SimpleNamespace

import pytest
import torch

from aner_lang.runtime.model import pinned_blocks

CPU = torch.device("cpu")


@pytest.fixture
def registered(monkeypatch):  # type: ignore[no-untyped-def]
    """The (pointer, bytes) of every registration, with an empty pool."""
    calls: list[tuple[int, int]] = []

    def register(ptr: int, size: int, flags: int) -> int:
        calls.append((ptr, size))
        return 0

    monkeypatch.setattr(pinned_blocks, "_FREE", defaultdict(lambda: defaultdict(list)))
    monkeypatch.setattr(pinned_blocks, "_PINNED", defaultdict(int))
    monkeypatch.setattr(torch.cuda, "cudart", lambda: SimpleNamespace(cudaHostRegister=register))
    return calls


@pytest.mark.parametrize(
    "saved",
    [
        torch.arange(15, dtype=torch.bfloat16).view(3, 5),
        torch.arange(15.0).view(3, 5).t(),  # a matmul saves transposed views
        torch.arange(24.0).view(2, 3, 4).permute(2, 0, 1),
        torch.arange(24.0).view(4, 6)[1:3],  # dense, at an offset into its storage
    ],
)
def test_a_copy_takes_exactly_its_bytes_in_its_layout(registered, saved):
    host = pinned_blocks.empty_like(saved)
    nbytes = saved.numel() * saved.element_size()
    assert [size for _, size in registered] == [nbytes]
    assert (host.shape, host.stride(), host.dtype) == (saved.shape, saved.stride(), saved.dtype)
    host.copy_(saved)
    assert torch.equal(host, saved)
    assert pinned_blocks.pinned_bytes(CPU) == nbytes


def test_a_freed_block_is_handed_out_again_for_its_size_or_up_to_twice_smaller(registered):
    first = pinned_blocks.empty_like(torch.empty(100, dtype=torch.uint8))
    pointer = first.data_ptr()
    del first
    again = pinned_blocks.empty_like(torch.empty(51, dtype=torch.uint8))  # 100 < 2 * 51
    assert again.data_ptr() == pointer and len(registered) == 1
    del again
    small = pinned_blocks.empty_like(torch.empty(50, dtype=torch.uint8))  # 100 >= 2 * 50
    assert len(registered) == 2 and registered[-1][1] == 50
    held = pinned_blocks.empty_like(torch.empty(100, dtype=torch.uint8))  # the 100 is free
    assert held.data_ptr() == pointer and len(registered) == 2
    assert pinned_blocks.pinned_bytes(CPU) == 150
    del small, held


def test_of_the_blocks_that_fit_the_smallest_is_handed_out(registered):
    blocks = [pinned_blocks.empty_like(torch.empty(n, dtype=torch.uint8)) for n in (70, 60)]
    sixty = blocks[1].data_ptr()
    del blocks
    assert pinned_blocks.empty_like(torch.empty(40, dtype=torch.uint8)).data_ptr() == sixty


def test_the_same_requests_update_after_update_pin_nothing_more(registered):
    sizes = [(7, 4096), (7, 1024), (32, 7), (7, 4096)]
    for _ in range(3):
        held = [pinned_blocks.empty_like(torch.empty(s, dtype=torch.bfloat16)) for s in sizes]
        del held
    assert len(registered) == len(sizes)
    assert pinned_blocks.pinned_bytes(CPU) == sum(a * b * 2 for a, b in sizes)


@pytest.mark.parametrize(
    ("t", "dense"),
    [
        (torch.empty(3, 4), True),
        (torch.empty(3, 4).t(), True),
        (torch.empty(1, 5, 1), True),
        (torch.empty(3, 4)[:, :2], False),  # a slice: gaps between its rows
        (torch.empty(4, 1).expand(4, 3), False),  # stride 0: elements shared
        (torch.empty(0, 3), False),
    ],
)
def test_only_tensors_that_fill_their_span_get_a_block_of_their_own(t, dense):
    assert pinned_blocks._dense(t) is dense


def test_a_layout_with_gaps_is_pinned_by_torch(registered, monkeypatch):
    made: list[torch.Tensor] = []

    def torch_pinned(t, **options):  # type: ignore[no-untyped-def]
        made.append(t)
        assert options == {"device": "cpu", "pin_memory": True}
        return torch.zeros_like(t)

    monkeypatch.setattr(torch, "empty_like", torch_pinned)
    gaps = torch.arange(12.0).view(3, 4)[:, :2]
    assert torch.equal(pinned_blocks.empty_like(gaps), torch.zeros(3, 2))
    assert made == [gaps] and registered == []


def test_a_failed_registration_says_so(registered, monkeypatch):
    monkeypatch.setattr(
        torch.cuda, "cudart", lambda: SimpleNamespace(cudaHostRegister=lambda p, n, f: 2)
    )
    with pytest.raises(RuntimeError, match="cudaHostRegister of 8 bytes failed"):
        pinned_blocks.empty_like(torch.empty(2))
    assert pinned_blocks.pinned_bytes(CPU) == 0

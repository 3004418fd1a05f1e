"""`host_copies`: detached CPU copies of many tensors, the small CUDA ones through one staging
buffer. Every copy has the original's bits, dtype and shape, keeps the input's order, and owns
its storage (safetensors refuses tensors that share memory)."""

from __future__ import annotations

import pytest
import torch
from safetensors.torch import load_file, save_file

from aner_lang.runtime.io import host_copy
from aner_lang.runtime.io.host_copy import (
    PINNED_MAX_BYTES,
    host_copies,
    host_copies_soon,
    keeping_staging,
    staging_bytes,
)
from aner_lang.runtime.train.state import TrainState


def _tensors(device: str) -> dict[str, torch.Tensor]:
    """Odd sizes and every dtype a snapshot holds: offsets that need aligning, a 0-d step, an
    empty tensor, a non-contiguous view, a bool mask, and one above the staging limit."""
    gen = torch.Generator().manual_seed(0)
    wide = torch.randn(7, 5, generator=gen)
    big = torch.randn(PINNED_MAX_BYTES // 4 + 3, generator=gen)
    cpu = {
        "b_odd": torch.randint(0, 255, (3,), generator=gen, dtype=torch.uint8),
        "a_f32": torch.randn(4, 3, generator=gen),
        "step": torch.tensor(7.0),
        "empty": torch.empty(0, 8),
        "bf16": torch.randn(5, 3, generator=gen).to(torch.bfloat16),
        "f64": torch.randn(3, generator=gen, dtype=torch.float64),
        "mask": torch.rand(9, generator=gen) > 0.5,
        "transposed": wide.t(),
        "big": big,
    }
    return {k: v.to(device) for k, v in cpu.items()}


def _check_copies(given: dict[str, torch.Tensor], copies: dict[str, torch.Tensor]) -> None:
    assert list(copies) == list(given)
    storages = set()
    for name, t in given.items():
        c = copies[name]
        assert c.device.type == "cpu" and c.is_contiguous(), name
        assert c.dtype == t.dtype and c.shape == t.shape, name
        assert torch.equal(c, t.cpu()), name
        if c.numel():
            assert c.untyped_storage().data_ptr() != t.untyped_storage().data_ptr(), name
            storages.add(c.untyped_storage().data_ptr())
    assert len(storages) == sum(1 for c in copies.values() if c.numel())


def _through_staging(
    given: dict[str, torch.Tensor], staging: host_copy._Staging | None = None
) -> host_copy.PendingCopies:
    """Copies of CPU tensors placed in a pageable staging buffer as `host_copies_soon` places
    CUDA ones in its pinned one, then copied out by the thread (`staging`, when given, is told
    of it)."""
    buffer = torch.empty(host_copy._staged_bytes(given), dtype=torch.uint8)
    return host_copy.PendingCopies(list(given), {}, host_copy._staged_into(buffer, given), staging)


def test_staged_copies_place_every_dtype_and_shape_apart(tmp_path):
    given = _tensors("cpu")
    copies = _through_staging(given).result()
    _check_copies(given, copies)
    given["a_f32"].add_(1.0)  # the copies are detached from the originals
    assert not torch.equal(copies["a_f32"], given["a_f32"])
    save_file(copies, str(tmp_path / "x.safetensors"))  # no two share memory
    assert all(torch.equal(v, copies[k]) for k, v in load_file(tmp_path / "x.safetensors").items())


def test_host_copies_of_cpu_tensors_are_detached_clones():
    given = _tensors("cpu")
    given["grad"] = torch.ones(3, requires_grad=True) * 2
    copies = host_copies(given)
    _check_copies(given, copies)
    assert not copies["grad"].requires_grad


@pytest.mark.cuda
def test_host_copies_of_cuda_tensors_match_their_bits_and_share_no_memory(tmp_path):
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    given = _tensors("cuda")
    copies = host_copies(given)
    _check_copies(given, copies)
    assert not any(c.is_pinned() for c in copies.values())  # the staging buffer is not kept
    save_file(copies, str(tmp_path / "x.safetensors"))


@pytest.mark.cuda
def test_a_run_keeps_one_pinned_staging_buffer_between_its_snapshots():
    """Inside `keeping_staging` the staging buffer is pinned ahead at the size given and reused
    by every copy; outside it no pinned memory stays held."""
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    given = _tensors("cuda")
    need = staging_bytes(given)
    assert 0 < need < sum(t.numel() * t.element_size() + 64 for t in given.values())
    with keeping_staging(need):
        first = host_copies(given)
        buffer = host_copy._STAGING.buffer
        assert buffer is not None and buffer.is_pinned() and buffer.numel() == need
        second = host_copies(given)
        assert host_copy._STAGING.buffer is buffer
    assert host_copy._STAGING.buffer is None
    _check_copies(given, first)
    _check_copies(given, second)


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.cuda)])
def test_originals_may_change_once_host_copies_soon_returns(device):
    """The transfers are done when `host_copies_soon` returns (only the copies out of the staging
    buffer go on in a thread): a training update right after it does not reach the copies."""
    if device == "cuda" and not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    given = _tensors(device)
    before = {k: v.cpu().clone() for k, v in given.items()}
    soon = host_copies_soon(given)
    for t in given.values():
        if t.dtype != torch.bool and t.numel():
            t.add_(1)
    _check_copies(before, soon.result())
    assert host_copy._STAGING.reader is None or not host_copy._STAGING.reader.is_alive()


def test_the_staging_buffer_is_reused_only_after_its_copies_are_made():
    """A use of the staging buffer waits for the thread still copying out of it (`settle`), and
    a copy that failed raises in the thread that asks for the result."""
    staging = host_copy._Staging()
    given = _tensors("cpu")
    copies = _through_staging(given, staging)
    assert staging.reader is not None
    staging.settle()
    assert staging.reader is None
    _check_copies(given, copies.result())
    unreadable = {"x": torch.empty(3, device="meta")}  # no data to copy out of
    with pytest.raises(NotImplementedError):
        host_copy.PendingCopies(["x"], {}, unreadable, None).result()


def test_a_train_state_reads_its_tensors_once_they_are_copied():
    given = _tensors("cpu")
    state = TrainState(host_copies_soon(given), {"counters": {"updates": 3}})
    assert state.updates == 3
    _check_copies(given, state.tensors)
    assert state.tensors is state.tensors  # resolved once

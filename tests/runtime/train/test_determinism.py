"""A run's deterministic kernels (`determinism.deterministic`) while it trains, and the
process's own settings after it."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch

from aner_lang.runtime import adapters as A
from aner_lang.runtime.tasks.data import from_texts
from aner_lang.runtime.train.determinism import deterministic
from aner_lang.runtime.train.profile import profile
from aner_lang.runtime.train.trainer import train


def _settings() -> tuple[bool, ...]:
    return (
        torch._C._get_deterministic_algorithms(),
        torch._C._get_deterministic_algorithms_warn_only(),
        torch._C._get_deterministic_fill_uninitialized_memory(),
        torch.backends.cudnn.benchmark,
    )


@pytest.fixture
def lenient() -> Iterator[tuple[bool, ...]]:
    """A process that set other values than a run does, put back after the test."""
    before = _settings()
    torch._C._set_deterministic_algorithms(False, warn_only=False)
    torch._C._set_deterministic_fill_uninitialized_memory(True)
    torch.backends.cudnn.benchmark = True
    try:
        yield _settings()
    finally:
        torch._C._set_deterministic_algorithms(before[0], warn_only=before[1])
        torch._C._set_deterministic_fill_uninitialized_memory(before[2])
        torch.backends.cudnn.benchmark = before[3]


def test_a_run_is_strict_inside_and_gives_the_process_its_settings_back(lenient):
    with deterministic(torch.device("cpu")):
        assert _settings() == (True, True, False, False)
        with pytest.warns(UserWarning, match="does not have a deterministic implementation"):
            torch.zeros(3).put_(torch.tensor([0]), torch.tensor([1.0]))
    assert _settings() == lenient


def test_train_leaves_the_settings_as_it_found_them(tiny_model, lenient):
    seen: list[tuple[bool, ...]] = []
    adapter = A.lora(tiny_model, rank=2, alpha=4.0, targets=["q_proj"], seed=1)
    layer = adapter.base.module.layers[0]
    hook = layer.register_forward_pre_hook(lambda *_: seen.append(_settings()))
    try:
        train(adapter, from_texts(["a few words to learn"], context=16), profile(), steps=1)
    finally:
        hook.remove()
    assert seen and all(s == (True, True, False, False) for s in seen)
    assert _settings() == lenient

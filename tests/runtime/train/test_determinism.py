"""A run's deterministic kernels (`determinism.deterministic`): strict while it trains, the
process's own settings after it, and attention's backward the same bits on CUDA."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch
import torch.nn.functional as F

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
    torch._C._set_deterministic_algorithms(True, warn_only=True)
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
        assert _settings() == (True, False, False, False)
        with pytest.raises(RuntimeError, match="does not have a deterministic implementation"):
            torch.zeros(3).put_(torch.tensor([0]), torch.tensor([1.0]))  # fails, not warns
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
    assert seen and all(s == (True, False, False, False) for s in seen)
    assert _settings() == lenient


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_attention_backward_gives_the_same_bits_twice_on_cuda():
    """bf16 grouped-query causal attention at a Llama-3-8B layer's heads, as the trainer calls
    it: its backward's gradients are the same bits from one call to the next (cuDNN's and the
    memory-efficient kernel's default backward are not)."""
    gen = torch.Generator(device="cuda").manual_seed(0)
    shape = {"q": (1, 32, 4096, 128), "k": (1, 8, 4096, 128), "v": (1, 8, 4096, 128)}
    inputs = {
        n: torch.randn(s, device="cuda", dtype=torch.bfloat16, generator=gen)
        for n, s in shape.items()
    }
    g = torch.randn(shape["q"], device="cuda", dtype=torch.bfloat16, generator=gen)

    def grads() -> list[torch.Tensor]:
        leaves = {n: t.detach().requires_grad_(True) for n, t in inputs.items()}
        out = F.scaled_dot_product_attention(*leaves.values(), is_causal=True, enable_gqa=True)
        out.backward(g)
        return [t.grad for t in leaves.values()]

    with deterministic(torch.device("cuda")):
        first, second = grads(), grads()
    assert all(torch.equal(a, b) for a, b in zip(first, second))

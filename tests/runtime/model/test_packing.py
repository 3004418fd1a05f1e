"""Packed rows attended per example (`packing.Segments`) against the `[B, 1, T, T]` mask: the
same losses and gradients, for grouped heads, sliding windows, soft-capped scores and rows
ending in padding; and which form a micro-batch gets."""

from __future__ import annotations

import pytest
import torch

from aner_lang.runtime import adapters as A
from aner_lang.runtime.model import packing
from aner_lang.runtime.model.activations import ActivationPolicy, keeping
from aner_lang.runtime.model.loss import IGNORE
from aner_lang.runtime.model.packing import Segments, packed_attention
from aner_lang.runtime.model.precision import autocast

pytest.importorskip("transformers")


def test_segments_are_the_examples_with_runs_of_one_token_examples_joined():
    positions = torch.tensor([[0, 1, 2, 0, 1, 0, 0, 1], [0, 1, 0, 0, 0, 0, 0, 0]])
    assert Segments.of(positions).rows == (
        ((0, 3, False), (3, 5, False), (5, 6, True), (6, 8, False)),
        ((0, 2, False), (2, 8, True)),
    )


def test_long_micro_batches_get_segments_and_short_ones_the_mask(monkeypatch):
    positions = torch.tensor([[0, 1, 2, 0, 1, 0, 0, 0]])
    assert isinstance(packed_attention(positions), torch.Tensor)
    monkeypatch.setattr(packing, "SEGMENTS_FROM_TOKENS", positions.numel())
    assert isinstance(packed_attention(positions), Segments)


def _batch(vocab: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Two packed rows of 40 tokens: three examples; two examples and five tokens of padding."""
    gen = torch.Generator().manual_seed(3)
    ids = torch.randint(3, vocab, (2, 40), generator=gen)
    lengths = [(17, 9, 14), (21, 14, 1, 1, 1, 1, 1)]
    positions = torch.stack([torch.cat([torch.arange(n) for n in row]) for row in lengths])
    targets = torch.cat([ids[:, 1:], torch.full((2, 1), IGNORE)], dim=1)
    targets[positions.roll(-1, dims=1) == 0] = IGNORE  # no target across examples
    targets[1, 35:] = IGNORE  # nor on the padding
    return ids, targets, positions


def _loss_and_grads(adapter, batch, precision: str, activations: str = "keep"):  # type: ignore[no-untyped-def]
    device = next(iter(adapter.params.values())).device
    ids, targets, positions = (t.to(device) for t in batch)
    for p in adapter.params.values():
        p.grad = None
    with keeping(ActivationPolicy(activations)), adapter.active():
        with autocast(precision, device):
            loss = adapter.model.module.loss(ids, targets, positions)
        loss.backward()
    return float(loss.detach()), {n: p.grad.clone() for n, p in adapter.params.items()}


def _trained_like(family: str, tmp_path, device: str, targets: list[str]):  # type: ignore[no-untyped-def]
    """A LoRA on `targets` of a small `family` model (Gemma's sliding window of 16 tokens,
    shorter than some examples) with a trained-like B, so every target's gradient flows."""
    from aner_lang.runtime.load.loader import load_model
    from aner_lang.testing.hf_fixture import write_hf_model

    config = {"sliding_window": 16} if family.startswith("gemma") else None
    model = load_model(write_hf_model(tmp_path, family, seed=4, config=config), device=device)
    adapter = A.lora(model, rank=2, alpha=4.0, targets=targets, seed=2)
    gen = torch.Generator().manual_seed(1)
    for p in adapter.params.values():
        p.data.copy_(0.05 * torch.randn(p.shape, generator=gen))
    return adapter


@pytest.mark.parametrize("family", ["llama3", "qwen3", "gemma3", "gemma2"])
@pytest.mark.parametrize("precision", ["float32", "bfloat16"])
def test_segments_give_the_masks_losses_and_gradients(
    family, precision, device, tmp_path, monkeypatch
):
    """Grouped heads (every family), Gemma 3's sliding window (of 16 tokens here, shorter than
    some examples) and Gemma 2's soft-capped scores: per example as over the mask (on CUDA in
    bfloat16, per example through the flash kernel)."""
    adapter = _trained_like(family, tmp_path, device, ["q_proj", "v_proj", "o_proj"])
    model = adapter.model
    assert model.config.num_attention_heads > model.config.num_key_value_heads
    batch = _batch(model.config.vocab_size)
    masked = _loss_and_grads(adapter, batch, precision)
    monkeypatch.setattr(packing, "SEGMENTS_FROM_TOKENS", 1)
    segmented = _loss_and_grads(adapter, batch, precision)
    # bfloat16: each path's gradients are 2-4% (in norm) from float32's, by rounding alone
    tolerance = 1e-5 if precision == "float32" else 3e-2
    assert segmented[0] == pytest.approx(masked[0], rel=tolerance)
    for name, g in masked[1].items():
        scale = float(g.norm())
        assert scale > 0, name
        assert float((segmented[1][name] - g).norm()) <= tolerance * scale, name


def test_segments_recompute_under_checkpointing_as_they_ran(tiny_model, monkeypatch):
    """A checkpointed layer holds the segments as the forward had them and recomputes the same
    attention calls: the gradients of keeping everything, bit for bit."""
    monkeypatch.setattr(packing, "SEGMENTS_FROM_TOKENS", 1)
    adapter = A.lora(tiny_model, rank=2, alpha=4.0, targets=["q_proj", "v_proj"], seed=2)
    gen = torch.Generator().manual_seed(1)
    for p in adapter.params.values():
        p.data.copy_(0.05 * torch.randn(p.shape, generator=gen))
    batch = _batch(tiny_model.config.vocab_size)
    kept = _loss_and_grads(adapter, batch, "float32")
    for mode in ("checkpoint", "offload"):
        again = _loss_and_grads(adapter, batch, "float32", mode)
        assert again[0] == kept[0]
        assert all(torch.equal(again[1][n], g) for n, g in kept[1].items()), mode


@pytest.mark.parametrize("family", ["llama3", "qwen3", "gemma3", "gemma2"])
@pytest.mark.parametrize("precision", ["float32", "bfloat16"])
def test_packed_rows_under_offload_keep_attention_and_give_the_kept_bits(
    family, precision, tmp_path
):
    """Packed rows attended over their mask (sliding windows and soft-capped scores too) under
    `offload`, whose recomputation takes attention's output from what the forward kept where
    SDPA saved it (`kept_through_backward`), and `checkpoint`: the loss and gradients of keeping
    everything, bit for bit."""
    adapter = _trained_like(family, tmp_path, "cpu", ["q_proj", "o_proj", "down_proj"])
    batch = _batch(adapter.model.config.vocab_size)
    kept = _loss_and_grads(adapter, batch, precision)
    for mode in ("checkpoint", "offload"):
        again = _loss_and_grads(adapter, batch, precision, mode)
        assert again[0] == kept[0], mode
        assert all(torch.equal(again[1][n], g) for n, g in kept[1].items()), mode

"""The half-precision step: the chunked head loss equals the logits loss, the residual stream is in
the compute dtype, and the NF4 input gradient in bf16 stays within the bound its rounding allows."""

from __future__ import annotations

import itertools

import pytest
import torch

from aner_lang.runtime import adapters as A
from aner_lang.runtime.load.loader import load_model
from aner_lang.runtime.model import loss as L
from aner_lang.runtime.model.chunking import DEQUANT_MAX_ELEMENTS, row_slices
from aner_lang.runtime.model.loss import IGNORE, head_loss_sum, logits_loss_sum
from aner_lang.runtime.model.precision import autocast
from aner_lang.runtime.nf4 import host_tiled
from aner_lang.runtime.nf4.quant import dequantize_nf4, quantize_nf4

BF16_U = 2.0**-8  # bfloat16's unit roundoff (8 significant bits, round to nearest: half of it)


@pytest.fixture(scope="module")
def nf4_model(tiny_bytes_gguf):
    return load_model(tiny_bytes_gguf, storage="nf4_double_quant", device="cpu")


def _batch(vocab: int, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, vocab, (2, 24), generator=gen)
    targets = torch.cat([ids[:, 1:], torch.full((2, 1), IGNORE)], dim=1)
    targets[0, :5] = IGNORE  # an unscored prompt
    return ids, targets


def test_chunked_head_loss_equals_the_logits_loss_and_its_gradient(nf4_model, monkeypatch):
    monkeypatch.setattr(L, "CHUNK_BYTES", 4 * nf4_model.config.vocab_size * 7)  # 7-token chunks
    ids, targets = _batch(nf4_model.config.vocab_size)
    head = nf4_model.module.lm_head
    with torch.autocast("cpu", dtype=torch.bfloat16):
        hidden = nf4_model.module.hidden_states(ids).detach().requires_grad_(True)
        ours = head_loss_sum(hidden, head, targets)
        (g_ours,) = torch.autograd.grad(ours * 3.0, hidden)
        ref = logits_loss_sum(head(hidden), targets)
        (g_ref,) = torch.autograd.grad(ref * 3.0, hidden)
    assert hidden.dtype == torch.bfloat16 and g_ours.dtype == torch.bfloat16
    ours_v, ref_v = float(ours.detach()), float(ref.detach())
    assert abs(ours_v - ref_v) <= 1e-5 * ref_v  # both fp32 sums over the same logits
    scale = g_ref.float().abs().max()
    assert float((g_ours.float() - g_ref.float()).abs().max()) <= 2 * BF16_U * float(scale)


def test_residual_stream_is_the_compute_dtype_and_float32_is_untouched(nf4_model):
    ids, targets = _batch(nf4_model.config.vocab_size, seed=1)
    with torch.no_grad():
        assert nf4_model.module.hidden_states(ids).dtype == torch.float32
        full = logits_loss_sum(nf4_model.forward(ids), targets)
        assert torch.equal(nf4_model.loss(ids, targets), full)  # the reference arithmetic
        with autocast("bfloat16", torch.device("cpu")):
            assert nf4_model.module.hidden_states(ids).dtype == torch.bfloat16
            half = nf4_model.loss(ids, targets)
    assert half.dtype == torch.float32 and abs(float(half - full)) < 0.02 * float(full)


def test_bf16_nf4_input_gradient_within_its_rounding_bound():
    """The backward to the input in bf16: grad_y and the dequantized W are each rounded to bf16
    (relative error u each), products accumulate in fp32, the result is rounded to bf16 once.
    So elementwise |ours - exact| <= (2u + u^2) (|grad_y| @ |W|) + u |exact|, with exact the
    fp32 product of the unrounded operands (whose own fp32 error is far below this)."""
    gen = torch.Generator().manual_seed(3)
    w = quantize_nf4(torch.randn(192, 320, generator=gen) * 0.05)
    g = torch.randn(17, 192, generator=gen)
    exact = host_tiled.grad_input(g, w)
    ours = host_tiled.grad_input(g.to(torch.bfloat16), w).float()
    dense = dequantize_nf4(w)
    bound = (2 * BF16_U + BF16_U**2) * (g.abs() @ dense.abs()) + BF16_U * exact.abs()
    assert ((ours - exact).abs() <= bound).all()
    assert (ours - exact).abs().max() > 0  # the half path really ran in bf16


def test_half_precision_lora_trains_and_its_first_gradients_track_fp32(nf4_model):
    """LoRA gradients of one bf16 step against the fp32 step on the same weights and batch."""
    ids, targets = _batch(nf4_model.config.vocab_size, seed=2)
    grads = {}
    for precision in ("float32", "bfloat16"):
        adapter = A.lora(nf4_model, rank=4, alpha=8.0, targets=["q_proj", "v_proj", "down_proj"])
        with torch.no_grad():
            for name, p in adapter.params.items():
                if name.endswith("lora_B"):
                    p.copy_(torch.randn(p.shape, generator=torch.Generator().manual_seed(7)) * 0.05)
        with autocast(precision, torch.device("cpu")):
            loss = adapter.loss(ids, targets) / int((targets != IGNORE).sum())
        loss.backward()
        grads[precision] = {n: p.grad.clone() for n, p in adapter.params.items()}
    for name, ref in grads["float32"].items():
        err = (grads["bfloat16"][name] - ref).norm() / ref.norm()
        assert err < 0.05, (name, float(err))


@pytest.mark.parametrize(
    "out_features,in_features", [(128256, 4096), (14336, 4096), (49152, 576), (7, 3), (1, 1 << 27)]
)
def test_row_slices_cover_the_weight_within_the_dequantization_limit(
    out_features: int, in_features: int
) -> None:
    """The NF4 many-token path dequantizes a weight in these row ranges: consecutive, covering
    every row once, each within the limit (but at least one row), and one range where the weight
    fits whole (every decoder-layer projection of Llama-3-8B; its 128k-vocabulary head does not)."""
    slices = row_slices(out_features, in_features)
    assert slices[0][0] == 0 and slices[-1][1] == out_features
    assert all(a[1] == b[0] for a, b in itertools.pairwise(slices))
    assert all(r1 - r0 == 1 or (r1 - r0) * in_features <= DEQUANT_MAX_ELEMENTS for r0, r1 in slices)
    whole = out_features * in_features <= DEQUANT_MAX_ELEMENTS
    assert (len(slices) == 1) == whole or out_features == 1
    if (out_features, in_features) == (128256, 4096):
        assert len(slices) == 8

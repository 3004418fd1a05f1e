"""The half-precision step: the chunked head loss equals the logits loss, the residual stream is in
the compute dtype, and the NF4 input gradient in bf16 stays within the bound its rounding allows."""

from __future__ import annotations

import itertools

import pytest
import torch

from aner_lang.runtime import adapters as A
from aner_lang.runtime.adapters.lora import _OnBases
from aner_lang.runtime.load.loader import load_model
from aner_lang.runtime.model import fused_cross_entropy
from aner_lang.runtime.model import loss as L
from aner_lang.runtime.model.chunking import DEQUANT_MAX_ELEMENTS, row_slices
from aner_lang.runtime.model.linear import outputs_of
from aner_lang.runtime.model.loss import IGNORE, head_loss_sum, logits_loss_sum
from aner_lang.runtime.model.precision import autocast
from aner_lang.runtime.nf4 import host_tiled
from aner_lang.runtime.nf4.linear import NF4Linear
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
    _check_head_loss(nf4_model, monkeypatch)


@pytest.mark.cuda
def test_fused_head_loss_on_cuda_equals_the_logits_loss_and_its_gradient(
    tiny_bytes_gguf, monkeypatch
):
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    model = load_model(tiny_bytes_gguf, storage="nf4_double_quant", device="cuda")
    hidden = torch.zeros(1, model.config.hidden_size, dtype=torch.bfloat16, device="cuda")
    if not fused_cross_entropy.available(hidden):
        pytest.skip("needs Triton")
    _check_head_loss(model, monkeypatch)


def _check_head_loss(model, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """`head_loss_sum` in 7-token chunks against the loss of the materialized logits."""
    monkeypatch.setattr(L, "CHUNK_BYTES", 4 * model.config.vocab_size * 7)  # 7 rows, fused 28
    ids, targets = (t.to(model.device) for t in _batch(model.config.vocab_size))
    head = model.module.lm_head
    with torch.autocast(model.device.type, dtype=torch.bfloat16):
        hidden = model.module.hidden_states(ids).detach().requires_grad_(True)
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


def _up_proj_lora(nf4_model, dropout: float, b_scale: float):
    """A LoRA on `up_proj` whose B is random (not PEFT's zeros), a bf16 input needing its
    gradient and an output gradient."""
    adapter = A.lora(nf4_model, rank=4, alpha=8.0, dropout=dropout, targets=["up_proj"])
    (name, module) = adapter.targets[0]
    a, b = adapter.params[f"{name}.lora_A"], adapter.params[f"{name}.lora_B"]
    with torch.no_grad():
        b.copy_(torch.randn(b.shape, generator=torch.Generator().manual_seed(5)) * b_scale)
    gen = torch.Generator().manual_seed(6)
    x = torch.randn(2, 5, module.in_features, generator=gen).to(torch.bfloat16).requires_grad_()
    g = torch.randn(2, 5, module.out_features, generator=gen).to(torch.bfloat16)
    return adapter, module, a, b, x, g


def test_half_precision_lora_is_one_node_with_the_base_input_gradient(nf4_model):
    """Without dropout the bf16 LoRA adds `s * B (A x)` into the NF4 output in place, and its one
    autograd node also gives the base's input gradient (`x`'s only producer of a gradient here):
    output and the gradients of x, A and B within a few bf16 roundings of the exact values, the
    delta's share of each large enough that leaving it out, or the base's, would show."""
    adapter, module, a, b, x, g = _up_proj_lora(nf4_model, dropout=0.0, b_scale=0.5)
    with torch.autocast("cpu", dtype=torch.bfloat16), adapter.active():
        ours = module(x)
    assert type(ours.grad_fn).__name__ == "_OnBasesBackward"
    feeders = {type(f).__name__ for f, _ in ours.grad_fn.next_functions if f is not None}
    assert feeders == {"AccumulateGrad"}  # x, A and B themselves: no base node, no addition
    got = torch.autograd.grad(ours, (x, a, b), g)
    w, xe, ge = module.dense_weight().double(), x.double(), g.double()
    ae, be = a.detach().double(), b.detach().double()
    xa = xe @ ae.t()
    delta = 2.0 * xa @ be.t()
    exact = (xe @ w.t() + delta, ge @ w + 2.0 * (ge @ be) @ ae,
             2.0 * (ge @ be).flatten(0, 1).t() @ xe.flatten(0, 1),
             2.0 * ge.flatten(0, 1).t() @ xa.flatten(0, 1))  # fmt: skip
    assert delta.norm() > 0.5 * (xe @ w.t()).norm()  # the delta is no rounding of the base
    for ours_t, exact_t in zip((ours, *got), exact):
        err = (ours_t.double() - exact_t).norm() / exact_t.norm()
        assert err < 4 * BF16_U, float(err)
    assert got[1].dtype == got[2].dtype == torch.float32  # the masters' gradients


def _random_b(adapter) -> None:  # type: ignore[no-untyped-def]
    gen = torch.Generator().manual_seed(5)
    with torch.no_grad():
        for name, t in adapter.params.items():
            if name.endswith("lora_B"):
                t.copy_(torch.randn(t.shape, generator=gen) * 0.5)


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.cuda)])
@pytest.mark.parametrize("delta_first", [False, True])
@pytest.mark.parametrize("targets", [["q_proj", "k_proj", "v_proj"], ["q_proj", "v_proj"]])
def test_half_precision_lora_targets_that_share_an_input_are_one_node(
    nf4_model, tiny_bytes_gguf, targets, delta_first, device, monkeypatch
):
    """q/k/v's LoRAs in bf16 (all three, or q and v with k bare) are one autograd node over
    their bases (`_OnBases`, through `linear.outputs_of`): every output and the gradients of x,
    each A and each B within a few bf16 roundings of the exact values (x's gradient sums the
    bases' and the deltas' of every target), the deltas large enough to show if one were left
    out. So too where the bases add their products and input gradients into the deltas' written
    first (`FrozenLinear.adds_product`, `adds_grad_input`, as the fused NF4 GEMMs do for many
    tokens)."""
    if device == "cuda" and not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    monkeypatch.setattr(NF4Linear, "adds_product", lambda self, x: delta_first)
    monkeypatch.setattr(NF4Linear, "adds_grad_input", lambda self, g: delta_first)
    model = (
        nf4_model
        if device == "cpu"
        else load_model(tiny_bytes_gguf, storage="nf4_double_quant", device=device)
    )
    attn = model.module.layers[0].self_attn
    adapter = A.lora(model, rank=4, alpha=8.0, targets=targets)
    _random_b(adapter)
    modules = (attn.q_proj, attn.k_proj, attn.v_proj)
    gen = torch.Generator().manual_seed(6)
    x = torch.randn(2, 5, attn.q_proj.in_features, generator=gen).to(device, torch.bfloat16)
    x.requires_grad_()
    with torch.autocast(device, dtype=torch.bfloat16), adapter.active():
        outs = outputs_of(x, modules)
    mine = [(n, t) for n, t in adapter.targets if any(t is m for m in modules)]
    hooked = [o for o, m in zip(outs, modules) if any(m is t for _, t in mine)]
    assert len(hooked) == len(targets) and len({id(o.grad_fn) for o in hooked}) == 1
    assert type(hooked[0].grad_fn).__name__ == "_OnBasesBackward"
    gs = [torch.randn(o.shape, generator=gen).to(device, torch.bfloat16) for o in outs]
    masters = [adapter.params[f"{n}.lora_{w}"] for w in "AB" for n, _ in mine]
    got = torch.autograd.grad(outs, (x, *masters), gs)
    xe, delta_of = x.double(), {}  # on the device: float64 products there
    exact_dx = torch.zeros_like(xe)
    exact_out, exact_da, exact_db = [], [], []
    for m, g in zip(modules, gs):
        w, ge = m.dense_weight().double(), g.double()
        out, dx = xe @ w.t(), ge @ w
        name = next((n for n, t in mine if t is m), None)
        if name is not None:
            a = adapter.params[f"{name}.lora_A"].detach().double()
            b = adapter.params[f"{name}.lora_B"].detach().double()
            xa = xe @ a.t()
            delta_of[name] = 2.0 * xa @ b.t()
            out, dx = out + delta_of[name], dx + 2.0 * (ge @ b) @ a
            exact_da.append(2.0 * (ge @ b).flatten(0, 1).t() @ xe.flatten(0, 1))
            exact_db.append(2.0 * ge.flatten(0, 1).t() @ xa.flatten(0, 1))
            assert delta_of[name].norm() > 0.3 * (xe @ w.t()).norm()
        exact_out.append(out)
        exact_dx += dx
    for ours_t, exact_t in zip((*outs, *got), (*exact_out, exact_dx, *exact_da, *exact_db)):
        err = (ours_t.double() - exact_t).norm() / exact_t.norm()
        assert err < 4 * BF16_U, float(err)


def test_float32_lora_targets_that_share_an_input_run_alone_with_the_same_bits(nf4_model):
    """The reference arithmetic (float32) keeps each target's own operations: `outputs_of`
    gives the bits of calling each module."""
    attn = nf4_model.module.layers[0].self_attn
    adapter = A.lora(nf4_model, rank=4, alpha=8.0, targets=["q_proj", "k_proj", "v_proj"])
    _random_b(adapter)
    modules = (attn.q_proj, attn.k_proj, attn.v_proj)
    x = torch.randn(2, 5, attn.q_proj.in_features, generator=torch.Generator().manual_seed(6))
    with adapter.active():
        together = outputs_of(x, modules)
        alone = [m(x) for m in modules]
    for t, a in zip(together, alone):
        assert torch.equal(t, a)


def test_half_precision_lora_without_gradients_takes_no_autograd_node(nf4_model, monkeypatch):
    """Evaluation and generation (no gradients) add the delta by the in-place GEMM alone: the
    one-node path, whose cost per call buys nothing there, is not entered."""
    adapter, module, _, _, x, _ = _up_proj_lora(nf4_model, dropout=0.0, b_scale=0.5)

    def entered(*args):
        raise AssertionError("the autograd node ran without gradients")

    monkeypatch.setattr(_OnBases, "apply", entered)
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16), adapter.active():
        assert module(x).dtype == torch.bfloat16


def test_half_precision_lora_with_dropout_adds_into_the_nf4_output_in_place_with_the_same_bits(
    nf4_model,
):
    """With dropout the bf16 LoRA adds `s * B (A dropout(x))` into the base output in place;
    output and gradients are the bits of the out-of-place `baddbmm` on the same operands (the
    same GEMM, one rounding). The NF4 output of a 3-D input is a tensor of its own, which
    autograd lets be changed in place."""
    adapter, module, a, b, x, g = _up_proj_lora(nf4_model, dropout=0.25, b_scale=0.05)
    adapter.train_mode(True)
    adapter.dropout_generator = torch.Generator().manual_seed(8)
    with torch.autocast("cpu", dtype=torch.bfloat16), adapter.active():
        base = module.forward(x)
        ours = module(x)
    assert base._base is None
    assert type(ours.grad_fn).__name__ == "BaddbmmBackward0"  # not a slice copy of a view
    keep = torch.empty(x.shape).bernoulli_(0.75, generator=torch.Generator().manual_seed(8))
    xa = (x * keep.to(x.dtype) / 0.75) @ a.to(torch.bfloat16).t()
    bt = b.to(torch.bfloat16).t().expand(2, 4, module.out_features)
    ref = torch.baddbmm(base, xa, bt, alpha=2.0)
    assert torch.equal(ours, ref)
    got = torch.autograd.grad(ours, (x, a, b), g)
    want = torch.autograd.grad(ref, (x, a, b), g)
    for ours_g, ref_g in zip(got, want):
        assert torch.equal(ours_g, ref_g)


@pytest.mark.cuda
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_fused_cross_entropy_rows_are_the_torch_arithmetic(dtype):
    """Per-row losses within fp32 rounding of the torch ops' (other summation orders), the
    gradient within one unit in the last place of the half dtype (two roundings of fp32 values a
    few fp32 units apart), ignored rows zero; two runs give the same bits."""
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    gen = torch.Generator(device="cuda").manual_seed(4)
    logits = (torch.randn(37, 50_001, generator=gen, device="cuda") * 4).to(dtype)
    targets = torch.randint(0, 50_001, (37,), generator=gen, device="cuda")
    targets[[0, 5, 36]] = IGNORE
    if not fused_cross_entropy.available(logits):
        pytest.skip("needs Triton")
    scored = targets != IGNORE
    z = logits.float()
    lse = torch.logsumexp(z, dim=-1)
    safe = torch.where(scored, targets, 0)
    want_loss = torch.where(scored, lse - z.gather(1, safe[:, None]).squeeze(1), 0.0)
    probs = (z - lse[:, None]).exp()
    probs[torch.arange(37, device="cuda"), safe] -= 1.0
    want_grad = (probs * scored[:, None]).to(dtype).float()
    got = logits.clone()
    loss = fused_cross_entropy.rows_in_place(got, targets, IGNORE)
    again = logits.clone()
    assert torch.equal(fused_cross_entropy.rows_in_place(again, targets, IGNORE), loss)
    assert torch.equal(again, got)
    assert loss.dtype == torch.float32
    assert ((loss - want_loss).abs() <= 1e-5 * want_loss.abs().clamp(min=1)).all()
    unit = 2.0**-8 if dtype == torch.bfloat16 else 2.0**-11
    tolerance = 2 * unit * want_grad.abs() + 1e-6
    assert ((got.float() - want_grad).abs() <= tolerance).all()
    assert (got[~scored] == 0).all()


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

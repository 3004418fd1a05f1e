"""Grouped GEMMs over mixture-of-experts layers (`model/experts.py`, `MoeMLP`'s grouped path).

`grouped_mm` equals a matmul per group (kernel and loop alike, empty groups included); a MoE layer
with LoRA on its experts runs grouped, with the loss and gradients of running each expert's own
modules; DoRA, TinyLoRA and `full` run each expert's modules; experts loaded together keep one
tensor (dense) or one NF4 weight quantized over all of them, each expert with the 4-bit codes of
quantizing it alone; a copied module no longer counts as the group and is stacked instead.
"""

from __future__ import annotations

import copy

import pytest
import torch

transformers = pytest.importorskip("transformers")

from aner_lang.runtime import adapters  # noqa: E402
from aner_lang.runtime.load.loader import load_model  # noqa: E402
from aner_lang.runtime.model import experts as ex  # noqa: E402
from aner_lang.runtime.model.loss import IGNORE  # noqa: E402
from aner_lang.runtime.model.moe import PROJECTIONS, MoeMLP  # noqa: E402
from aner_lang.runtime.model.precision import autocast  # noqa: E402
from aner_lang.testing.hf_fixture import LLAMACPP_MOE, MOE_FAMILIES, TEXTS, write_hf_model  # noqa: E402

EXPERT_TARGETS = list(PROJECTIONS)
ALIGNED = {"hidden_size": 128, "intermediate_size": 128, "moe_intermediate_size": 128,
           "head_dim": 32}  # fmt: skip
"""Experts of 128x128 = 64 * 256 elements: NF4 quantizes them together; heads of 32 (4 of them
fill the hidden size), so every weight has the 64-multiple rows the fused NF4 kernels take."""


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("width", [16, 12])  # 12 bf16 columns: not 16-byte rows, the loop runs
@pytest.mark.parametrize("counts", [[3, 0, 5, 2], [0, 0, 10, 0], [4, 3, 3, 0]])
@pytest.mark.parametrize("transposed", [False, True])
def test_grouped_mm_equals_a_matmul_per_group(dtype, width, counts, transposed):
    gen = torch.Generator().manual_seed(sum(counts) + width)
    a = torch.randn(sum(counts), 8 * 4, generator=gen).to(dtype).requires_grad_(True)
    shape = (len(counts), width, 32) if transposed else (len(counts), 32, width)
    w = torch.randn(*shape, generator=gen).to(dtype).requires_grad_(True)
    b = w.transpose(1, 2) if transposed else w
    offs = torch.tensor(counts).cumsum(0).to(torch.int32)
    got = ex.grouped_mm(a, b, offs)
    grad = torch.randn(got.shape, generator=gen).to(dtype)
    ga, gw = torch.autograd.grad(got, (a, w), grad)
    ends = offs.tolist()
    want = torch.cat([a[s:e] @ b[g] for g, (s, e) in enumerate(zip([0, *ends[:-1]], ends))])
    wa, ww = torch.autograd.grad(want, (a, w), grad)
    tol = {"atol": 1e-5, "rtol": 1e-5} if dtype == torch.float32 else {"atol": 5e-2, "rtol": 2e-2}
    torch.testing.assert_close(got, want, **tol)
    torch.testing.assert_close(ga, wa, **tol)
    torch.testing.assert_close(gw, ww, **tol)
    empty = [g for g, n in enumerate(counts) if n == 0]
    assert torch.equal(gw[empty], torch.zeros_like(gw[empty]))  # no rows: no gradient


@pytest.mark.parametrize("counts", [[3, 0, 5, 2], [0, 0, 9, 0], [8, 1, 0, 7]])
@pytest.mark.parametrize("align", [1, 4, 8])
def test_padded_groups_start_on_the_alignment_with_zero_rows_between(counts, align):
    x = torch.arange(sum(counts) * 2, dtype=torch.float32).reshape(-1, 2) + 1
    rows, ends, place = ex.padded_groups(x, torch.tensor(counts), align)
    assert rows.shape[0] == x.shape[0] + len(counts) * (align - 1) == int(ends[-1])
    assert torch.equal(rows[place], x)
    assert int((rows != 0).any(dim=1).sum()) == x.shape[0]  # every other row is zero
    starts = [0, *ends.tolist()[:-1]]
    assert all(s % align == 0 for s in starts)
    done = 0
    for e, n in enumerate(counts):  # expert e's rows in its own group, in order
        assert place[done : done + n].tolist() == list(range(starts[e], starts[e] + n))
        done += n


@pytest.mark.parametrize("align", [4, 8])
def test_padded_groups_give_the_loops_loss_and_gradients(folder, align, monkeypatch):
    """The CUDA layout (each expert's rows padded to 16 bytes' worth), run on the CPU."""
    from aner_lang.runtime.model import moe

    model = load_model(folder, device="cpu")
    adapter = adapters.lora(model, rank=3, alpha=6.0, targets=EXPERT_TARGETS)
    _trained_b(adapter)
    with monkeypatch.context() as m:
        m.setattr(moe, "row_alignment", lambda *_: align)
        grouped = _loss_and_grads(adapter)
    _looped(monkeypatch)
    _assert_same(grouped, _loss_and_grads(adapter), "float32")


def test_rows_align_to_16_bytes_on_cuda_only():
    assert ex.row_alignment(torch.empty(0), torch.bfloat16) == 1
    if torch.cuda.is_available():
        x = torch.empty(0, device="cuda")
        assert ex.row_alignment(x, torch.bfloat16) == 8
        assert ex.row_alignment(x, torch.float32) == 4


def test_kernel_runs_only_where_torch_takes_it():
    cpu = torch.device("cpu")
    assert ex.kernel_runs(torch.bfloat16, cpu, 64, 16)
    assert not ex.kernel_runs(torch.bfloat16, cpu, 64, 12)  # 24-byte rows
    assert not ex.kernel_runs(torch.float16, cpu, 64, 16)
    assert ex.kernel_runs(torch.float32, cpu, 64, 4)


@pytest.fixture(scope="module", params=MOE_FAMILIES)
def folder(request, tmp_path_factory):
    return write_hf_model(tmp_path_factory.mktemp(request.param) / "hf", request.param, seed=3)


def _batch(model):
    ids = torch.tensor([model.tokenizer.encode(t)[:24] for t in TEXTS[:2]])
    return ids, torch.cat([ids[:, 1:], torch.full((ids.shape[0], 1), IGNORE)], dim=1)


def _loss_and_grads(adapter, precision="float32"):
    ids, targets = (t.to(adapter.device) for t in _batch(adapter.model))
    adapter.train_mode(True)
    with autocast(precision, adapter.device):
        loss = adapter.loss(ids, targets)
    names = sorted(adapter.params)
    params = [adapter.params[n] for n in names]
    grads = torch.autograd.grad(loss, params, allow_unused=True)  # an expert without tokens
    zero = [torch.zeros_like(p) if g is None else g for p, g in zip(params, grads)]
    return loss.detach(), dict(zip(names, zero))


def _trained_b(adapter, seed=0):
    """Nonzero B matrices, so every expert's LoRA changes its output."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in adapter.params.items():
            if name.endswith("lora_B"):
                p.copy_(torch.randn(p.shape, generator=gen) * 0.05)


def _assert_same(grouped, looped, precision):
    """Loss and gradients equal to fp32 rounding; in bfloat16, to its rounding over each tensor
    (elementwise tolerances fail on the odd element near zero)."""
    (loss_g, grads_g), (loss_l, grads_l) = grouped, looped
    if precision == "float32":
        torch.testing.assert_close(loss_g, loss_l, atol=1e-5, rtol=1e-5)
        for name, g in grads_l.items():
            torch.testing.assert_close(grads_g[name], g, atol=1e-6, rtol=1e-4)
        return
    torch.testing.assert_close(loss_g, loss_l, atol=0, rtol=1e-2)
    for name, g in grads_l.items():
        assert (grads_g[name] - g).norm() <= 3e-2 * g.norm() + 1e-6, name


def _looped(monkeypatch):
    monkeypatch.setattr(MoeMLP, "_grouped_adapters", lambda self: None)


@pytest.mark.parametrize("storage", ["float32", "nf4_double_quant"])
@pytest.mark.parametrize("precision", ["float32", "bfloat16"])
def test_expert_lora_runs_grouped_with_the_loops_loss_and_gradients(
    folder, storage, precision, monkeypatch
):
    model = load_model(folder, storage=storage, device="cpu")
    adapter = adapters.lora(model, rank=3, alpha=6.0, targets=["q_proj", *EXPERT_TARGETS])
    _trained_b(adapter)
    with monkeypatch.context() as m:  # the grouped path, and never the loop
        m.setattr(MoeMLP, "_looped", lambda *_: pytest.fail("ran the experts one by one"))
        grouped = _loss_and_grads(adapter, precision)
    _looped(monkeypatch)
    _assert_same(grouped, _loss_and_grads(adapter, precision), precision)
    moved = [n for n, g in grouped[1].items() if ".experts." in n and g.abs().sum() > 0]
    assert len(moved) >= 6  # several experts' A and B got their own gradients


@pytest.mark.parametrize(
    "make",
    [
        lambda m: adapters.dora(m, rank=2, alpha=4.0, targets=EXPERT_TARGETS),
        lambda m: adapters.tinylora(m, rank=2, targets=EXPERT_TARGETS),
        adapters.full,
    ],
    ids=["dora", "tinylora", "full"],
)
def test_adapters_that_need_each_experts_weight_run_each_expert(folder, make, monkeypatch):
    model = load_model(folder, device="cpu")
    adapter = make(model)
    mlp = next(m for m in model.module.modules() if isinstance(m, MoeMLP))
    with adapter.active():
        assert mlp._grouped_adapters() is None
        assert mlp.reads_host(torch.bfloat16)
    calls = []
    original = MoeMLP._looped
    monkeypatch.setattr(MoeMLP, "_looped", lambda *a: calls.append(1) or original(*a))
    loss, grads = _loss_and_grads(adapter)
    assert calls and torch.isfinite(loss)
    assert any(g.abs().sum() > 0 for g in grads.values())


def test_no_adapter_and_lora_need_no_host_read_where_the_kernel_runs(folder):
    model = load_model(folder, device="cpu")
    mlp = next(m for m in model.module.modules() if isinstance(m, MoeMLP))
    assert mlp._grouped_adapters() == {p: [] for p in PROJECTIONS}
    assert not mlp.reads_host(torch.bfloat16)
    assert mlp.reads_host(torch.float16)  # no grouped kernel for float16 here: the loop runs
    adapter = adapters.lora(model, rank=2, alpha=4.0, targets=["up_proj"])
    with adapter.active():
        plans = mlp._grouped_adapters()
        assert plans is not None and [a for a, _ in plans["up_proj"]] == [adapter]
        assert plans["up_proj"][0][1] == sorted(plans["up_proj"][0][1])
        assert not mlp.reads_host(torch.float32)


def test_dense_experts_share_one_tensor_and_a_copy_is_stacked(folder):
    model = load_model(folder, device="cpu")
    mlp = next(m for m in model.module.modules() if isinstance(m, MoeMLP))
    for name in PROJECTIONS:
        modules = mlp._projections(name)
        group = ex.expert_group(modules)
        assert isinstance(group, ex.DenseExpertGroup)
        stack = group.stack(torch.float32)
        assert stack.data_ptr() == modules[0].weight.data_ptr()  # no copy
        assert torch.equal(stack, torch.stack([m.dense_weight() for m in modules]))
    copied = copy.deepcopy(mlp)
    modules = copied._projections("gate_proj")
    assert ex.expert_group(modules) is None  # the copy's weights are its own
    x = torch.randn(6, modules[0].in_features)
    offs = torch.tensor([2, 2, 5, 6], dtype=torch.int32)  # four experts, the second without rows
    torch.testing.assert_close(
        ex.grouped_frozen(x, offs, modules),
        ex.grouped_frozen(x, offs, mlp._projections("gate_proj")),
    )


def test_nf4_experts_quantized_together_keep_each_experts_codes(tmp_path):
    from aner_lang.runtime.nf4.linear import NF4ExpertGroup
    from aner_lang.runtime.nf4.quant import block_absmax, dequantize_nf4, quantize_nf4

    folder = write_hf_model(tmp_path / "hf", "mixtral", seed=5, config=ALIGNED)
    dense = load_model(folder, device="cpu")
    nf4 = load_model(folder, storage="nf4_double_quant", device="cpu")
    for layer_d, layer_q in zip(dense.module.layers, nf4.module.layers):
        for name in PROJECTIONS:
            modules = layer_q.mlp._projections(name)
            group = ex.expert_group(modules)
            assert isinstance(group, NF4ExpertGroup)
            assert torch.equal(
                group.stack(torch.float32), torch.stack([m.dense_weight() for m in modules])
            )
            for m, d in zip(modules, layer_d.mlp._projections(name)):
                alone = quantize_nf4(d.dense_weight())
                assert torch.equal(m.weight_nf4.packed, alone.packed)  # the same 4-bit codes
                # only the block scales differ (the double quantization's offset), as close to
                # the true absmax as quantizing alone gets, and no weight moves more than its
                # block's scale
                true = d.dense_weight().reshape(-1, 64).abs().amax(dim=1)
                joint, own = block_absmax(m.weight_nf4), block_absmax(alone)
                assert (joint - true).abs().max() <= 2 * (own - true).abs().max()
                diff = (dequantize_nf4(m.weight_nf4) - dequantize_nf4(alone)).reshape(-1, 64)
                assert (diff.abs() <= (joint - own).abs()[:, None] * (1 + 1e-6)).all()
    modules = nf4.module.layers[0].mlp._projections("up_proj")
    joint = ex.expert_group(modules).joint  # what memory() counts: the joint bytes, and each
    total = sum(m.nbytes()["packed_base"] for m in modules)  # expert's copy of the offset
    assert total == joint.packed_nbytes() + 4 * (len(modules) - 1)


def test_unaligned_nf4_experts_are_quantized_alone_and_stacked_per_use(folder):
    from aner_lang.runtime.nf4.quant import quantize_nf4

    dense = load_model(folder, device="cpu")
    nf4 = load_model(folder, storage="nf4_double_quant", device="cpu")
    modules = nf4.module.layers[0].mlp._projections("down_proj")
    assert ex.expert_group(modules) is None
    want = dense.module.layers[0].mlp._projections("down_proj")[1].dense_weight()
    assert torch.equal(modules[1].weight_nf4.qabsmax, quantize_nf4(want).qabsmax)


@pytest.mark.parametrize("family", MOE_FAMILIES)
@pytest.mark.parametrize("dtype", ["q8_0", "f16"])
def test_gguf_experts_keep_the_files_blocks_in_one_tensor_and_run_grouped(
    family, tmp_path, dtype, monkeypatch
):
    """Under `storage: gguf` a projection's experts are row slices of one tensor of the file's
    blocks (quantized) or one 16-bit stack (f16): the stack a grouped GEMM multiplies by is every
    expert's own weight, and a LoRA on them trains grouped with the loop's loss and gradients."""
    from aner_lang.runtime.export.gguf import export_gguf
    from aner_lang.runtime.ggml.linear import GGUFExpertGroup, GGUFLinear

    config = LLAMACPP_MOE if family == "qwen3_moe" else None  # what a GGUF of it can hold
    folder = write_hf_model(tmp_path / "hf", family, seed=3, config=config)
    path = export_gguf(load_model(folder, device="cpu"), tmp_path / f"{dtype}.gguf", dtype=dtype)
    model = load_model(path, storage="gguf", device="cpu")
    mlp = next(m for m in model.module.modules() if isinstance(m, MoeMLP))
    blocks = 0
    for name in PROJECTIONS:  # a width q8_0's 32-blocks do not divide is written 16-bit
        modules = mlp._projections(name)
        group = ex.expert_group(modules)
        quantized = isinstance(modules[0], GGUFLinear)
        assert isinstance(group, GGUFExpertGroup if quantized else ex.DenseExpertGroup)
        want = torch.stack([m.dense_weight() for m in modules])
        assert torch.equal(group.stack(torch.float32), want)
        joint = group.joint.raw.nbytes if quantized else group.weights.nbytes
        assert sum(sum(m.nbytes().values()) for m in modules) == joint  # no copy beside it
        blocks += quantized
    assert (blocks > 0) == (dtype == "q8_0")
    adapter = adapters.lora(model, rank=2, alpha=4.0, targets=EXPERT_TARGETS)
    _trained_b(adapter)
    grouped = _loss_and_grads(adapter)
    _looped(monkeypatch)
    _assert_same(grouped, _loss_and_grads(adapter), "float32")


@pytest.mark.cuda
@pytest.mark.parametrize("storage", ["float32", "nf4_double_quant"])
def test_cuda_expert_lora_runs_grouped_with_the_loops_loss_and_gradients(
    tmp_path, storage, monkeypatch
):
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    folder = write_hf_model(tmp_path / "hf", "qwen3_moe", seed=5, config=ALIGNED)
    model = load_model(folder, storage=storage, device="cuda")
    mlp = next(m for m in model.module.modules() if isinstance(m, MoeMLP))
    assert ex.expert_group(mlp._projections("gate_proj")) is not None
    adapter = adapters.lora(model, rank=5, alpha=10.0, targets=["v_proj", *EXPERT_TARGETS])
    _trained_b(adapter)
    with adapter.active():
        assert not mlp.reads_host(torch.bfloat16)  # the CUTLASS kernel: a step graphs can record
    grouped = _loss_and_grads(adapter, "bfloat16")
    _looped(monkeypatch)
    _assert_same(grouped, _loss_and_grads(adapter, "bfloat16"), "bfloat16")

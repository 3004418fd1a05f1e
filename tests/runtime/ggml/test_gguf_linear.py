"""`storage: gguf`: the tiled matmul over a file's blocks against dequantize + matmul for every
block type (CPU, and CUDA where marked), embedding rows, and whole models loaded with the file's
blocks against the same files dequantized by the float32 loader."""

from __future__ import annotations

import gguf
import numpy as np
import pytest
import torch

from aner_lang.problems.errors import AnerRuntimeError
from aner_lang.runtime.ggml.linear import GGUFHostTiled, GGUFLinear
from aner_lang.runtime.ggml.weight import GGUFWeight
from aner_lang.runtime.io.ggml_blocks import DEQUANTIZERS, FP16_FIELDS
from aner_lang.runtime.load.loader import load_model
from aner_lang.runtime.model.linear import FrozenLinear
from aner_lang.runtime.nf4.backends import HostTiled, using_backend
from aner_lang.runtime.train.memory import memory_report
from aner_lang.testing.fixture import TENSOR_TYPES, write_fixture


def _weight(qtype: str, out: int = 96, n_in: int = 512, seed: int = 0) -> GGUFWeight:
    """Random blocks with small finite scales: an `[out, n_in]` weight of type `qtype`."""
    size, type_size = gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType[qtype]]
    n = out * n_in // size
    rng = np.random.default_rng(seed)
    raw = rng.integers(0, 256, (n, type_size), dtype=np.uint8)
    for at in FP16_FIELDS[qtype]:
        raw[:, at : at + 2] = rng.normal(0, 0.02, n).astype(np.float16).view(np.uint8).reshape(n, 2)
    return GGUFWeight(torch.from_numpy(raw.reshape(out, -1)), qtype, (out, n_in))


def _close(got: torch.Tensor, want: torch.Tensor) -> None:
    """Equal up to fp32 summation order: the tiles add partial sums in another order than one
    matmul, so the bound is relative to the largest magnitude."""
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6 * float(want.abs().max()))


def _check_matmul(w: GGUFWeight, device: str) -> None:
    budget = 16 * w.shape[1] * 4  # 16 rows a tile: 6 tiles
    layer = GGUFLinear(GGUFWeight(w.raw.to(device), w.qtype, w.shape))
    dense = layer.dense_weight()
    assert torch.equal(dense.cpu(), w.rows(0, w.shape[0]))  # same bits on every device
    x = torch.randn(5, 3, w.shape[1], generator=torch.Generator().manual_seed(1)).to(device)
    x.requires_grad_(True)
    with using_backend(HostTiled(budget)):
        y = layer(x)
        y.square().sum().backward()
    _close(y, x.detach() @ dense.t())
    _close(x.grad, (2 * y.detach()) @ dense)
    g = torch.randn(7, w.shape[0], generator=torch.Generator().manual_seed(2)).to(device)
    _close(layer.grad_input(g), g @ dense)
    ids = torch.tensor([[3, 0, 95], [3, 17, 40]], device=device)
    assert torch.equal(layer.rows(ids), dense[ids])


@pytest.mark.parametrize("qtype", sorted(DEQUANTIZERS))
def test_tiled_forward_and_input_gradient_equal_dequantize_then_matmul(qtype: str) -> None:
    _check_matmul(_weight(qtype), "cpu")


@pytest.mark.cuda
@pytest.mark.parametrize("qtype", sorted(DEQUANTIZERS))
def test_tiled_matmul_on_cuda_equals_dequantize_then_matmul(qtype: str) -> None:
    if not torch.cuda.is_available():
        pytest.skip("no CUDA GPU")
    _check_matmul(_weight(qtype), "cuda")


def test_the_tile_budget_sets_the_tiles_and_not_the_result() -> None:
    w = _weight("Q4_K", out=50)
    assert [r1 - r0 for r0, r1, _ in w.tiles(torch.float32, 16 * 512 * 4)] == [16, 16, 16, 2]
    assert [r1 - r0 for r0, r1, _ in w.tiles(torch.float32, 1)] == [1] * 50  # at least a row
    x = torch.randn(4, 512)
    small, whole = GGUFHostTiled(1), GGUFHostTiled()
    _close(small.linear(x, w), whole.linear(x, w))
    assert small.identity(torch.device("cpu"), torch.float32) != whole.identity(
        torch.device("cpu"), torch.float32
    )


@pytest.mark.parametrize("tensor_type", [t for t in TENSOR_TYPES if t != "f32"])
def test_a_model_kept_as_blocks_equals_the_same_file_dequantized(tensor_type, tmp_path) -> None:
    """Every weight (q/k rows un-permuted as whole byte rows) is bit for bit the float32 loader's,
    and the logits agree, for every tensor type the fixture writer makes."""
    path = write_fixture(tmp_path / f"{tensor_type}.gguf", "tiny", seed=3, tensor_type=tensor_type)
    kept, dense = load_model(path, "gguf", "cpu"), load_model(path, "float32", "cpu")
    assert kept.storage == "gguf"
    pairs = [
        (name, m, dense.module.get_submodule(name))
        for name, m in kept.module.named_modules()
        if isinstance(m, FrozenLinear)
    ]
    assert len(pairs) > 7
    for name, m, d in pairs:
        assert torch.equal(m.dense_weight(), d.dense_weight()), name
        if tensor_type in ("f16", "bf16"):
            assert m.storage == {"f16": "float16", "bf16": "bfloat16"}[tensor_type]
        else:
            assert isinstance(m, GGUFLinear) and m.qtype == tensor_type.upper()
    ids = torch.tensor([[1, 5, 9, 200, 7, 3]])
    torch.testing.assert_close(kept.forward(ids), dense.forward(ids), rtol=1e-4, atol=1e-4)
    tensors = sum(t.nbytes for t in kept_file_tensors(path))
    assert memory_report(kept).weights == tensors <= path.stat().st_size


def kept_file_tensors(path):
    from aner_lang.runtime.io.gguf import GGUFFile

    return GGUFFile(path).tensors.values()


def test_the_real_smollm2_kept_as_blocks_weighs_its_file(smollm2_path, real_model) -> None:
    kept = load_model(smollm2_path, "gguf", "cpu")
    report = memory_report(kept)
    assert report.packed_base > 0.99 * report.weights
    assert report.weights == sum(t.nbytes for t in kept_file_tensors(smollm2_path))
    assert report.weights <= smollm2_path.stat().st_size
    q = kept.module.layers[0].self_attn.q_proj
    assert isinstance(q, GGUFLinear) and q.qtype == "Q4_1"
    assert torch.equal(
        q.dense_weight(), real_model.module.layers[0].self_attn.q_proj.dense_weight()
    )
    ids = torch.tensor([kept.tokenizer.encode("The capital of France is")])
    torch.testing.assert_close(kept.forward(ids), real_model.forward(ids), rtol=1e-3, atol=1e-3)


def test_storage_gguf_of_a_hugging_face_folder_is_a_clear_error(tmp_path) -> None:
    from aner_lang.testing.hf_fixture import write_hf_model

    folder = write_hf_model(tmp_path / "hf", "llama3")
    with pytest.raises(AnerRuntimeError) as e:
        load_model(folder, "gguf", "cpu")
    assert e.value.code == "E-GGUF-STORAGE" and "Hugging Face folder" in str(e.value)


def test_the_run_backend_picks_the_gguf_path_and_its_tile_budget() -> None:
    from aner_lang.runtime.ggml.linear import gguf_backend
    from aner_lang.runtime.nf4.backends import active_backend

    outside = gguf_backend(active_backend(torch.device("cpu")))
    with using_backend(HostTiled(4096)):
        inside = gguf_backend(active_backend(torch.device("cpu")))
    assert (outside.name, outside.tile_bytes, inside.tile_bytes) == ("host_tiled", 8 << 20, 4096)


def _fused_or_skip():
    if not torch.cuda.is_available():
        pytest.skip("no CUDA GPU")
    pytest.importorskip("cupy")
    from aner_lang.runtime.ggml import fused

    return fused


def _rel(got: torch.Tensor, want: torch.Tensor) -> float:
    return float((got.double() - want).norm() / want.norm())


@pytest.mark.cuda
@pytest.mark.parametrize("qtype", sorted(DEQUANTIZERS))
def test_fused_matmuls_equal_dequantize_then_matmul_for_every_type(qtype: str) -> None:
    """The fused GGUF path against the dense weight in float64, for the few-token kernels (1, 3,
    16 tokens) and the many-token dequantize + cuBLAS path (40), forward and input gradient, in
    each compute dtype: fp32 within summation-order error, 16-bit within the inputs' rounding.
    The input gradient is the same bits on a second call (fixed-order slab sums)."""
    fused = _fused_or_skip()
    w = _weight(qtype, out=200, n_in=1024, seed=3)
    w = GGUFWeight(w.raw.cuda(), qtype, w.shape)
    dense = w.rows(0, w.shape[0]).double()
    gen = torch.Generator(device="cuda").manual_seed(4)
    for dtype, bound in ((torch.float32, 1e-5), (torch.bfloat16, 2e-2), (torch.float16, 3e-3)):
        for m in (1, 3, 16, 40):
            x = torch.randn(m, w.shape[1], device="cuda", generator=gen).to(dtype)
            g = torch.randn(m, w.shape[0], device="cuda", generator=gen).to(dtype)
            y, gx = fused.linear(x, w), fused.grad_input(g, w)
            assert y.dtype == gx.dtype == dtype and y.shape == (m, 200) and gx.shape == (m, 1024)
            assert _rel(y, x.double() @ dense.t()) < bound, (dtype, m)
            assert _rel(gx, g.double() @ dense) < bound, (dtype, m)
            assert torch.equal(fused.grad_input(g, w), gx)
            y32 = fused.linear(x, w, out_dtype=torch.float32)
            assert y32.dtype == torch.float32 and _rel(y32, x.double() @ dense.t()) < bound


@pytest.mark.cuda
def test_fused_many_token_path_in_row_slices_equals_whole(monkeypatch) -> None:
    """A weight over the dequant buffer's limit goes through in row slices with the same result,
    and the shared buffer never grows past one slice."""
    fused = _fused_or_skip()
    from aner_lang.runtime.model import chunking, dense_matmul

    w = _weight("Q6_K", out=300, n_in=512, seed=6)
    w = GGUFWeight(w.raw.cuda(), "Q6_K", w.shape)
    x = torch.randn(64, 512, device="cuda")
    g = torch.randn(64, 300, device="cuda")
    whole_y, whole_gx = fused.linear(x, w), fused.grad_input(g, w)
    monkeypatch.setattr(chunking, "DEQUANT_MAX_ELEMENTS", 96 * 512)
    monkeypatch.setattr(dense_matmul, "_BUFFERS", {})
    _close(fused.linear(x, w), whole_y)  # the same dot products, in another order perhaps
    _close(fused.grad_input(g, w), whole_gx)  # fp32 slice sums: summation order only
    assert max(b.numel() for b in dense_matmul._BUFFERS.values()) == 96 * 512


@pytest.mark.cuda
@pytest.mark.parametrize("tensor_type", ["q4_0", "q8_0"])
def test_training_a_gguf_base_on_cuda_fused_matches_host_tiled(tensor_type, tmp_path) -> None:
    """`kernel: auto` on CUDA trains a `storage: gguf` base through the fused GGUF kernels, which
    the run's identity names, with the losses host_tiled gives (fp32: summation order only)."""
    _fused_or_skip()
    from aner_lang.runtime.adapters import lora
    from aner_lang.runtime.tasks.data import from_texts
    from aner_lang.runtime.train.profile import profile
    from aner_lang.runtime.train.trainer import train

    path = write_fixture(tmp_path / "m.gguf", "tiny", seed=3, tensor_type=tensor_type)
    base = load_model(path, "gguf", "cuda")
    data = from_texts(["a b c d e f g h", "h g f e d c b a", "one two three four"], 16)
    losses = {}
    for kernel in ("auto", "host_tiled"):
        adapter = lora(base, rank=4, targets=["q_proj", "v_proj", "down_proj"], seed=1)
        run = train(adapter, data, profile(kernel=kernel, precision="float32"), steps=4)
        losses[kernel], identity = run.loss_history, run.kernel_identity
        assert ("aner.gguf.cuda.fused/1" in identity) == (kernel == "auto"), identity
    torch.testing.assert_close(losses["auto"], losses["host_tiled"], rtol=1e-4, atol=1e-5)


def test_a_checkpointed_gguf_base_leaves_down_projs_product_out_of_its_recomputation(
    tmp_path, monkeypatch
) -> None:
    """Kept as blocks, a checkpointed layer's recomputation skips down_proj's product as an NF4
    base's does (`activations.last_saves`), and the gradients are the bits of keeping
    everything."""
    from aner_lang.runtime.adapters import lora
    from aner_lang.runtime.ggml import linear as ggml_linear
    from aner_lang.runtime.model.activations import ActivationPolicy, keeping

    path = write_fixture(tmp_path / "m.gguf", "tiny", seed=3, tensor_type="q4_0")
    base = load_model(path, "gguf", "cpu")
    shapes: list[tuple[int, ...]] = []
    matmul = ggml_linear.NF4Matmul

    class Recording:
        @staticmethod
        def apply(x, w, backend):  # type: ignore[no-untyped-def]
            shapes.append(tuple(w.shape))
            return matmul.apply(x, w, backend)

    monkeypatch.setattr(ggml_linear, "NF4Matmul", Recording)
    ids = torch.tensor([[1, 5, 9, 200, 7, 3, 4, 8]])
    targets = torch.tensor([[5, 9, 200, 7, 3, 4, 8, -100]])
    down = (base.config.hidden_size, base.config.intermediate_size)

    def grads(mode: str) -> tuple[dict[str, torch.Tensor], int]:
        shapes.clear()
        adapter = lora(base, rank=4, targets=["down_proj"], seed=1)
        adapter.train_mode(True)
        with keeping(ActivationPolicy(mode)), adapter.active():
            adapter.loss(ids, targets).backward()
        return {n: p.grad for n, p in adapter.params.items()}, shapes.count(down)

    kept, kept_down = grads("keep")
    ours, our_down = grads("checkpoint")
    assert kept_down == our_down == base.config.num_hidden_layers
    for name, g in kept.items():
        assert torch.equal(g, ours[name]), name

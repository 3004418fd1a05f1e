"""`storage: gguf`: the tiled matmul over a file's blocks against dequantize + matmul for every
block type (CPU, and CUDA where marked), embedding rows, and whole models loaded with the file's
blocks against the same files dequantized by the float32 loader."""

from __future__ import annotations

import gguf
import numpy as np
import pytest
import torch

from aner_lang.problems.errors import AnerRuntimeError
from aner_lang.runtime.ggml.blocks import DEQUANTIZERS, FP16_FIELDS
from aner_lang.runtime.ggml.linear import GGUFHostTiled, GGUFLinear
from aner_lang.runtime.ggml.weight import GGUFWeight
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


def test_kernel_fused_is_refused_for_a_gguf_base_and_auto_is_host_tiled() -> None:
    from aner_lang.runtime.ggml.linear import gguf_backend, require_kernel
    from aner_lang.runtime.nf4.backends import active_backend

    for kernel in ("auto", "host_tiled"):
        require_kernel(kernel)
    with pytest.raises(AnerRuntimeError) as e:
        require_kernel("fused")
    assert e.value.code == "E-KERNEL-UNAVAILABLE" and "storage: gguf" in str(e.value)
    outside = gguf_backend(active_backend(torch.device("cpu")))
    with using_backend(HostTiled(4096)):
        inside = gguf_backend(active_backend(torch.device("cpu")))
    assert (outside.name, outside.tile_bytes, inside.tile_bytes) == ("host_tiled", 8 << 20, 4096)


@pytest.mark.cuda
def test_training_a_gguf_base_with_kernel_fused_is_refused_on_cuda(tmp_path) -> None:
    from aner_lang.runtime.adapters import lora
    from aner_lang.runtime.nf4.fused.availability import unavailable_reason
    from aner_lang.runtime.tasks.data import from_texts
    from aner_lang.runtime.train.profile import profile
    from aner_lang.runtime.train.trainer import train

    if not torch.cuda.is_available() or unavailable_reason() is not None:
        pytest.skip("no CUDA GPU with the fused kernels' requirements")
    path = write_fixture(tmp_path / "q4_0.gguf", "tiny", seed=3, tensor_type="q4_0")
    adapter = lora(load_model(path, "gguf", "cuda"), rank=4, targets=["q_proj"])
    with pytest.raises(AnerRuntimeError) as e:
        train(adapter, from_texts(["a b c d e f"], 8), profile(kernel="fused"), steps=1)
    assert e.value.code == "E-KERNEL-UNAVAILABLE" and "storage: gguf" in str(e.value)

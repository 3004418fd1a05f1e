"""Under NF4 the embedding and lm_head stay 16-bit by default (QLoRA's convention), in the source's
own 16-bit type; `quantize_embeddings` stores them as NF4 too, and a run's identity says which."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from aner_lang.runtime.load.loader import load_model
from aner_lang.runtime.model.linear import DenseLinear
from aner_lang.runtime.nf4.backends import active_backend
from aner_lang.runtime.nf4.linear import NF4Linear
from aner_lang.runtime.train.profile import profile
from aner_lang.runtime.train.trainer import run_identity

pytest.importorskip("transformers")


@pytest.fixture(scope="module")
def bf16_folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny Llama 3 HF folder saved in bfloat16 (its lm_head tied to the embedding)."""
    from aner_lang.testing.hf_fixture import build_hf_model, write_hf_model

    folder = write_hf_model(tmp_path_factory.mktemp("bf16"), "llama3")
    model = build_hf_model("llama3", load_model(folder, device="cpu").config.vocab_size)
    model.to(torch.bfloat16).save_pretrained(str(folder))
    return folder


def test_16_bit_tables_keep_the_files_bfloat16_bits(bf16_folder: Path) -> None:
    from safetensors.torch import load_file

    model = load_model(bf16_folder, storage="nf4_double_quant", device="cpu")
    stored = load_file(str(bf16_folder / "model.safetensors"))
    m = model.module
    assert isinstance(m.embed_tokens, DenseLinear) and m.embed_tokens.weight.dtype == torch.bfloat16
    assert torch.equal(m.embed_tokens.weight, stored["model.embed_tokens.weight"])
    assert m.lm_head is m.embed_tokens
    assert all(isinstance(layer.mlp.down_proj, NF4Linear) for layer in m.layers)


def test_quantize_embeddings_stores_them_as_nf4_and_the_identity_says_so(bf16_folder: Path) -> None:
    from aner_lang.runtime import adapters as A

    default = load_model(bf16_folder, storage="nf4_double_quant", device="cpu")
    packed = load_model(
        bf16_folder, storage="nf4_double_quant", device="cpu", quantize_embeddings=True
    )
    assert isinstance(packed.module.embed_tokens, NF4Linear)
    assert isinstance(packed.module.lm_head, NF4Linear)
    dense = load_model(bf16_folder, storage="float32", device="cpu")
    ids = torch.tensor([[1, 5, 9, 33, 7, 80, 12]])
    with torch.no_grad():  # NF4 on the tables moves the logits further from the file's model
        ref = dense.forward(ids)
        near, far = (default.forward(ids) - ref).norm(), (packed.forward(ids) - ref).norm()
    assert 0 < near < far
    prof = profile()
    backend = active_backend(torch.device("cpu"))
    ids_default = run_identity(A.lora(default, rank=2), prof, backend)
    ids_packed = run_identity(A.lora(packed, rank=2), prof, backend)
    assert "embeddings=bfloat16" in ids_default and "embeddings=nf4_double_quant" in ids_packed


def test_dense_storages_ignore_nothing(bf16_folder: Path) -> None:
    """float32 and float16 bases store the tables as they store every matrix."""
    for storage, dtype in (("float32", torch.float32), ("float16", torch.float16)):
        m = load_model(bf16_folder, storage=storage, device="cpu").module
        assert m.embed_tokens.weight.dtype == dtype and m.lm_head.weight.dtype == dtype


def test_a_16_bit_table_meets_the_other_16_bit_type_in_its_own() -> None:
    """A float16 table under bfloat16 compute converts the activations, not the table, and gives
    the caller its own dtype back; float32 compute widens the table."""
    gen = torch.Generator().manual_seed(0)
    w = torch.randn(64, 16, generator=gen)
    table = DenseLinear(w, "float16")
    x = torch.randn(3, 16, generator=gen).to(torch.bfloat16)
    want = torch.nn.functional.linear(x.half(), w.half()).bfloat16()
    assert torch.equal(table(x), want) and table(x).dtype == torch.bfloat16
    g = torch.randn(3, 64, generator=gen).to(torch.bfloat16)
    assert torch.equal(table.grad_input(g), (g.half() @ w.half()).bfloat16())
    x32 = x.float()
    assert torch.equal(table(x32), torch.nn.functional.linear(x32, w.half().float()))
    # inside a bfloat16 autocast region (the training step's loss) too: autocast would cast the
    # float16 table to bfloat16, a whole copy of it per call, and give other bits
    want_g = (g.half() @ w.half()).bfloat16()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert torch.equal(table(x), want)
        assert torch.equal(table.grad_input(g), want_g)
        assert not torch.equal(
            torch.nn.functional.linear(x.half(), table.weight).bfloat16(), want
        )  # what autocast alone would have computed


def test_a_float32_table_beyond_float16_is_refused_not_stored_as_infinity(tmp_path: Path) -> None:
    """A float32 folder's tables become float16 under NF4: a value float16 cannot hold would be
    an infinite logit, so the load refuses it, naming the weight, where float32 storage keeps it."""
    from safetensors.torch import load_file, save_file

    from aner_lang.problems.errors import AnerRuntimeError
    from aner_lang.testing.hf_fixture import write_hf_model

    folder = write_hf_model(tmp_path, "llama3")
    weights = folder / "model.safetensors"
    tensors = load_file(str(weights))
    table = tensors["model.embed_tokens.weight"].float()
    table[3, 2] = 1.0e6  # float16 tops out at 65504
    tensors["model.embed_tokens.weight"] = table
    save_file({k: v.contiguous() for k, v in tensors.items()}, str(weights))
    assert (
        load_model(folder, storage="float32", device="cpu").module.embed_tokens.weight[3, 2] == 1e6
    )
    with pytest.raises(AnerRuntimeError) as err:
        load_model(folder, storage="nf4_double_quant", device="cpu")
    assert err.value.code == "E-MODEL-WEIGHTS"
    assert "embed_tokens" in err.value.message and "in float16" in err.value.message

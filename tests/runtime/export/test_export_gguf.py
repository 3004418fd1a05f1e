"""merge() and export_gguf(): our loader and HF transformers read the export with our logits."""

from __future__ import annotations

import pytest
import torch

from aner_lang.problems.errors import AnerRuntimeError
from aner_lang.runtime.adapters.full import Full
from aner_lang.runtime.adapters.lora import DoRA, LoRA
from aner_lang.runtime.adapters.merge import merge
from aner_lang.runtime.export.gguf import export_gguf
from aner_lang.runtime.load.loader import load_model

IDS = torch.tensor([[1, 5, 77, 300, 12, 9, 4000, 2]])


def test_f32_export_round_trips_exactly(tiny_model, tmp_path):
    out = export_gguf(tiny_model, tmp_path / "tiny.gguf", dtype="f32")
    again = load_model(out, "float32", "cpu")
    assert torch.equal(again.forward(IDS), tiny_model.forward(IDS))
    assert again.tokenizer.encode("hello world") == tiny_model.tokenizer.encode("hello world")


@pytest.mark.parametrize("cls", [LoRA, DoRA])
def test_merge_keeps_the_adapter_logits(trained_like, tiny_model, cls):
    adapter = trained_like(
        cls(
            tiny_model,
            rank=2,
            alpha=4.0,
            dropout=0.0,
            targets=["q_proj", "k_proj", "v_proj", "down_proj"],
            seed=7,
        )
    )
    merged = merge(adapter)
    want = adapter.forward(IDS)
    assert not torch.allclose(want, tiny_model.forward(IDS), atol=1e-3)  # the adapter matters
    torch.testing.assert_close(merged.forward(IDS), want, atol=2e-5, rtol=1e-5)
    assert torch.equal(tiny_model.forward(IDS), tiny_model.forward(IDS))  # base untouched


def test_merge_of_full_uses_every_trained_tensor(trained_like, tiny_model):
    adapter = trained_like(Full(tiny_model), seed=5)
    torch.testing.assert_close(
        merge(adapter).forward(IDS), adapter.forward(IDS), atol=2e-5, rtol=1e-5
    )


def test_f16_export_of_a_merge_loads_in_hf_and_ours(trained_like, tiny_model, tmp_path):
    transformers = pytest.importorskip("transformers")
    adapter = trained_like(
        LoRA(
            tiny_model,
            rank=2,
            alpha=4.0,
            dropout=0.0,
            targets=["q_proj", "k_proj", "v_proj"],
            seed=1,
        )
    )
    want = adapter.forward(IDS)
    out = export_gguf(merge(adapter), tmp_path / "merged.gguf", dtype="f16")
    ours = load_model(out, "float32", "cpu").forward(IDS)
    hf = transformers.AutoModelForCausalLM.from_pretrained(
        str(tmp_path), gguf_file=out.name, dtype=torch.float32
    )
    with torch.no_grad():
        theirs = hf(IDS).logits
    torch.testing.assert_close(theirs, ours, atol=1e-4, rtol=1e-4)
    assert (ours - want).abs().max() < 0.02  # only the f16 rounding of the weights
    assert (ours - tiny_model.forward(IDS)).abs().max() > 0.05


def test_export_refuses_bad_arguments(tiny_model, tmp_path):
    with pytest.raises(AnerRuntimeError, match="unknown dtype 'q9'"):
        export_gguf(tiny_model, tmp_path / "x.gguf", dtype="q9")
    adapter = LoRA(tiny_model, rank=1, alpha=1.0, dropout=0.0, targets=["q_proj"], seed=0)
    with pytest.raises(AnerRuntimeError, match="merge the adapter first"):
        export_gguf(adapter, tmp_path / "x.gguf")

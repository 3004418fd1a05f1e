"""export_lora_gguf writes llama.cpp's LoRA layout exactly (read back here with gguf); export_hf
writes a folder HF transformers loads with our logits and our tokens."""

from __future__ import annotations

import json

import gguf
import pytest
import torch

from aner_lang.problems.errors import AnerRuntimeError
from aner_lang.runtime.adapters import dora, full, lora, tinylora
from aner_lang.runtime.adapters.merge import merge
from aner_lang.runtime.export.hf import export_hf
from aner_lang.runtime.export.lora_gguf import export_lora_gguf
from aner_lang.runtime.io.gguf import unpermute_rows

IDS = torch.tensor([[1, 5, 77, 100, 12, 9, 40, 2]])


def _read(path):
    reader = gguf.GGUFReader(str(path))
    fields = {k: f.contents() for k, f in reader.fields.items() if not k.startswith("GGUF.")}
    tensors = {t.name: torch.tensor(t.data.copy()) for t in reader.tensors}
    return fields, tensors


@pytest.mark.parametrize("make", [lora, tinylora], ids=["lora", "tinylora"])
def test_a_low_rank_adapter_becomes_llama_cpp_lora_tensors(
    make, trained_like, tiny_model, tmp_path
) -> None:
    targets = ["q_proj", "k_proj", "v_proj", "down_proj"]
    adapter = trained_like(make(tiny_model, rank=2, targets=targets, seed=4))
    fields, tensors = _read(export_lora_gguf(adapter, tmp_path / "adapter.gguf"))
    assert fields["general.type"] == "adapter" and fields["adapter.type"] == "lora"
    assert fields["general.architecture"] == "llama" and fields["adapter.lora.alpha"] == 2.0
    merged = merge(adapter).module
    config = tiny_model.config
    assert len(tensors) == 2 * len(adapter.targets)
    for name, module in adapter.targets:
        layer, kind = int(name.split(".")[1]), name.split(".")[-1]
        p = tiny_model.architecture.projection(kind)
        a, b = tensors[f"{p.gguf_tensor(layer)}.lora_a"], tensors[f"{p.gguf_tensor(layer)}.lora_b"]
        assert a.shape == (2, module.in_features) and b.shape == (module.out_features, 2)
        if p.rope_heads:  # stored in llama.cpp's rotary row order, like the weight itself
            b = unpermute_rows(b, getattr(config, p.rope_heads))
        delta = merged.get_submodule(name).dense_weight() - module.dense_weight()
        assert delta.abs().max() > 1e-3
        torch.testing.assert_close(b @ a, delta, atol=2e-6, rtol=1e-4)


@pytest.mark.parametrize("make", [dora, full], ids=["dora", "full"])
def test_adapters_that_are_not_low_rank_are_refused(make, trained_like, tiny_model, tmp_path):
    kwargs = {"rank": 2, "seed": 1} if make is dora else {}
    adapter = trained_like(make(tiny_model, **kwargs))
    with pytest.raises(AnerRuntimeError, match="export_lora_gguf") as info:
        export_lora_gguf(adapter, tmp_path / "x.gguf")
    assert info.value.code == "E-EXPORT" and "merged model" in info.value.notes[0]
    assert not (tmp_path / "x.gguf").exists() and not list(tmp_path.glob(".*tmp"))


def test_hf_folder_loads_in_transformers_with_our_logits(
    trained_like, tiny_bytes_gguf, tmp_path
) -> None:
    transformers = pytest.importorskip("transformers")
    from aner_lang.runtime.load.loader import load_model

    base = load_model(tiny_bytes_gguf, "float32", "cpu")
    adapter = trained_like(lora(base, rank=2, targets=["q_proj", "v_proj", "up_proj"], seed=2))
    merged = merge(adapter)
    folder = export_hf(merged, tmp_path / "merged")
    assert sorted(p.name for p in folder.iterdir()) == [
        "config.json",
        "generation_config.json",
        "model.safetensors",
        "tokenizer.json",
        "tokenizer_config.json",
    ]
    config = json.loads((folder / "config.json").read_text())
    assert config["model_type"] == "llama" and config["architectures"] == ["LlamaForCausalLM"]
    hf = transformers.AutoModelForCausalLM.from_pretrained(str(folder), dtype=torch.float32)
    tok = transformers.AutoTokenizer.from_pretrained(str(folder))
    text = "Aner exports to transformers."
    ids = tok(text, return_tensors="pt").input_ids
    assert ids[0].tolist() == base.tokenizer.encode(text)
    with torch.no_grad():
        theirs = hf(ids).logits
    torch.testing.assert_close(theirs, merged.forward(ids), atol=1e-5, rtol=1e-5)
    assert (merged.forward(ids) - base.forward(ids)).abs().max() > 1e-3  # the adapter is in it
    # a second export replaces the folder; a model is needed, not an adapter
    export_hf(merged, folder, dtype="float16", overwrite=True)
    assert json.loads((folder / "config.json").read_text())["torch_dtype"] == "float16"
    with pytest.raises(AnerRuntimeError, match="merge the adapter first"):
        export_hf(adapter, tmp_path / "nope")

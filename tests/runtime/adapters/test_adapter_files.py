"""save_adapter / load_adapter: PEFT loads our adapters onto the HF model with our logits."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest
import torch

from aner_lang.problems.errors import AnerRuntimeError
from aner_lang.runtime import adapters
from aner_lang.runtime.adapters.files import load_adapter, save_adapter

IDS = torch.tensor([[1, 5, 77, 300, 12, 9, 4000, 2]])
_TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "up_proj"]


_MAKERS = {
    "lora": lambda m: adapters.lora(m, rank=2, alpha=4.0, targets=_TARGETS, seed=1),
    "lora_fa": lambda m: adapters.lora_fa(m, rank=2, alpha=3.0, targets=_TARGETS, seed=2),
    "dora": lambda m: adapters.dora(m, rank=2, alpha=4.0, targets=_TARGETS, seed=3),
    "tinylora": lambda m: adapters.tinylora(m, parameters=13, rank=2, targets=_TARGETS, seed=4),
}


@pytest.fixture(scope="module")
def hf_tiny(tiny_gguf):
    transformers = pytest.importorskip("transformers")
    return transformers.AutoModelForCausalLM.from_pretrained(
        str(tiny_gguf.parent), gguf_file=tiny_gguf.name, dtype=torch.float32
    ).eval()


@pytest.mark.parametrize("method", sorted(_MAKERS))
def test_peft_loads_our_adapter_with_our_logits(
    trained_like, method, tiny_model, hf_tiny, tmp_path
):
    peft = pytest.importorskip("peft")
    adapter = trained_like(_MAKERS[method](tiny_model))
    want = adapter.forward(IDS)
    assert (want - tiny_model.forward(IDS)).abs().max() > 1e-3
    out = save_adapter(adapter, tmp_path / "a", format="peft")
    assert sorted(p.name for p in out.iterdir()) == [
        "adapter_config.json",
        "adapter_model.safetensors",
    ]
    model = peft.PeftModel.from_pretrained(copy.deepcopy(hf_tiny), str(out)).eval()
    with torch.no_grad():
        theirs = model(IDS).logits
    torch.testing.assert_close(theirs, want, atol=1e-4, rtol=1e-4)
    back = load_adapter(tiny_model, out)  # and our own reader of PEFT's format
    torch.testing.assert_close(back.forward(IDS), want, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("method", ["lora_fa", "tinylora", "full"])
def test_safetensors_format_reloads_bit_for_bit(trained_like, method, tiny_model, tmp_path):
    make = _MAKERS.get(method, adapters.full)
    adapter = trained_like(make(tiny_model))
    out = save_adapter(adapter, tmp_path / "a", format="safetensors")
    back = load_adapter(tiny_model, out)
    assert back.method == method and back.config == adapter.config
    for k, v in adapter.tensors().items():
        assert torch.equal(back.tensors()[k], v)
    assert torch.equal(back.forward(IDS), adapter.forward(IDS))


def test_bad_adapter_directories_are_refused(tiny_model, tmp_path):
    with pytest.raises(AnerRuntimeError, match=r"neither adapter\.json nor adapter_config\.json"):
        load_adapter(tiny_model, tmp_path)
    with pytest.raises(AnerRuntimeError, match="no PEFT LoRA form"):
        save_adapter(adapters.full(tiny_model), tmp_path / "f", format="peft")
    with pytest.raises(AnerRuntimeError, match="unknown adapter format"):
        save_adapter(_MAKERS["lora"](tiny_model), tmp_path / "f", format="onnx")
    out = save_adapter(_MAKERS["lora"](tiny_model), tmp_path / "p", format="peft")
    cfg = json.loads((out / "adapter_config.json").read_text())
    (out / "adapter_config.json").write_text(json.dumps({**cfg, "peft_type": "IA3"}))
    with pytest.raises(AnerRuntimeError, match="peft_type 'IA3' is not supported"):
        load_adapter(tiny_model, out)
    (out / "adapter_config.json").write_text(json.dumps({**cfg, "r": 3}))
    with pytest.raises(AnerRuntimeError, match="missing or has the wrong shape"):
        load_adapter(tiny_model, out)
    (out / "adapter_model.safetensors").write_bytes(b"garbage")
    with pytest.raises(AnerRuntimeError, match=r"adapter_model\.safetensors cannot be read"):
        load_adapter(tiny_model, out)


def test_safetensors_adapter_refuses_another_base(tiny_model, tmp_path):
    from aner_lang.runtime.load.loader import load_model
    from aner_lang.testing.fixture import write_fixture

    out = save_adapter(_MAKERS["lora"](tiny_model), tmp_path / "a", format="safetensors")
    other = load_model(write_fixture(tmp_path / "other.gguf", "tiny", seed=9), "float32", "cpu")
    with pytest.raises(AnerRuntimeError, match="different base model") as e:
        load_adapter(other, out)
    assert e.value.code == "E-ADAPTER-BASE"


def _recorded_base(adapter, out) -> str:
    save_adapter(adapter, out, format="peft")
    return json.loads((out / "adapter_config.json").read_text())["base_model_name_or_path"]


def test_peft_export_names_a_base_that_loads(tiny_gguf, hf_tiny, tmp_path):
    """A GGUF base is recorded by its path, which Aner and transformers (`gguf_file=`) load, never
    by its display name (`general.name`)."""
    from aner_lang.runtime.load.loader import load_model

    model = load_model(tiny_gguf, "float32", "cpu")
    recorded = _recorded_base(_MAKERS["lora"](model), tmp_path / "a")
    assert recorded == str(tiny_gguf.absolute()) != model.name
    assert torch.equal(load_model(recorded, "float32", "cpu").forward(IDS), model.forward(IDS))
    transformers = pytest.importorskip("transformers")
    theirs = transformers.AutoModelForCausalLM.from_pretrained(
        str(Path(recorded).parent), gguf_file=Path(recorded).name, dtype=torch.float32
    ).eval()
    with torch.no_grad():
        torch.testing.assert_close(theirs(IDS).logits, hf_tiny(IDS).logits)


@pytest.mark.parametrize(
    ("key", "value", "recorded"),
    [
        (
            "general.source.repo_url",
            "https://huggingface.co/Org/Tiny-Instruct",
            "Org/Tiny-Instruct",
        ),
        ("general.source.url", "https://hf.co/Org/Tiny-Instruct/tree/main", "Org/Tiny-Instruct"),
        ("general.source.huggingface.repository", "Org/Tiny-Instruct", "Org/Tiny-Instruct"),
        ("general.source.url", "https://example.com/Org/Tiny", None),
        ("general.source.repo_url", "https://huggingface.co/datasets/Org/Data", None),
        ("general.base_model.0.repo_url", "https://huggingface.co/Org/Tiny", None),
    ],
)
def test_peft_export_names_the_hub_repo_a_gguf_was_converted_from(
    tiny_gguf, tmp_path, key, value, recorded
):
    """The repository in `general.source.*` is this model's own; `general.base_model.*` names
    the model it was fine-tuned from, so it is never recorded (the path is)."""
    from aner_lang.runtime.load.loader import load_model

    model = load_model(tiny_gguf, "float32", "cpu")
    model.metadata[key] = value
    got = _recorded_base(_MAKERS["lora"](model), tmp_path / "a")
    assert got == (recorded or str(tiny_gguf.absolute()))

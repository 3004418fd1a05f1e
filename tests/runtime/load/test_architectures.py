"""Every supported architecture, from a Hugging Face folder and from a GGUF, against transformers.

For each family (Llama 3 with llama3 rope scaling and tied embeddings, Mistral, Qwen2 with q/k/v
biases, Qwen3 with q/k norms, Gemma 3, Gemma 2 with soft-caps, Phi-3 with fused qkv and gate/up
matrices, Phi-4-mini with LongRoPE and partial rotary dimensions) a tiny random-weight model is
built with transformers and saved as a folder, then converted to GGUF as llama.cpp's converter
writes it. Aner's logits from both equal transformers', tokenization equals the `tokenizers`
library's, the chat template renders as transformers renders it, LoRA trains, merge and NF4 work,
and the PEFT export loads in transformers + PEFT with identical logits.
"""

from __future__ import annotations

import json

import pytest
import torch

transformers = pytest.importorskip("transformers")

from aner_lang.builtins import registry  # noqa: E402
from aner_lang.runtime import adapters  # noqa: E402
from aner_lang.runtime.adapters.files import save_adapter  # noqa: E402
from aner_lang.runtime.adapters.merge import merge  # noqa: E402
from aner_lang.runtime.load.loader import load_model  # noqa: E402
from aner_lang.runtime.model.info import model_info  # noqa: E402
from aner_lang.testing.hf_fixture import (  # noqa: E402
    FAMILIES,
    TEXTS,
    tiny_family,
)


def _all(model) -> list[str]:
    """Every adapter target of the model's architecture (Phi-3's are its fused matrices)."""
    return list(model.architecture.targets)


@pytest.fixture(scope="module", params=FAMILIES)
def family(request, tmp_path_factory):
    """(name, folder, gguf path, transformers model) of one family."""
    return request.param, *tiny_family(tmp_path_factory.mktemp(request.param), request.param, 7)


def _ids(model, text=TEXTS[0]):
    return torch.tensor([model.tokenizer.encode(text)])


def test_logits_equal_transformers_from_folder_and_gguf(family):
    name, folder, gguf, hf = family
    for path in (folder, gguf):
        ours = load_model(path, device="cpu")
        family_table = {"llama3": "llama", "mistral": "llama", "phi4mini": "phi3"}
        assert ours.config.architecture == family_table.get(name, name)
        documented = {f.name: f.doc for f in registry().types["ModelInfo"].fields}["architecture"]
        assert f'"{model_info(ours).architecture}"' in documented
        ids = _ids(ours)
        with torch.no_grad():
            want = hf(ids).logits
            assert (ours.forward(ids) - want).abs().max().item() <= 1e-4
            assert float(want.abs().max()) > 1.0  # the comparison is not between near-zero logits


def test_tokenization_equals_the_tokenizers_library(family):
    from tokenizers import Tokenizer

    _, folder, gguf, _ = family
    reference = Tokenizer.from_file(str(folder / "tokenizer.json"))
    for path in (folder, gguf):
        tok = load_model(path, device="cpu").tokenizer
        for text in TEXTS:
            want = reference.encode(text, add_special_tokens=True).ids
            assert tok.encode(text) == want
            assert tok.decode(want) == reference.decode(want, skip_special_tokens=False)


def test_chat_template_renders_as_transformers_does(family):
    name, folder, gguf, _ = family
    hf_tok = transformers.AutoTokenizer.from_pretrained(str(folder))
    messages = [{"role": "user", "content": "What is 2 + 2?"}]
    if name != "mistral":
        messages.insert(0, {"role": "system", "content": "Be brief."})
    want = hf_tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    for path in (folder, gguf):
        assert load_model(path, device="cpu").tokenizer.apply_chat_template(messages) == want


def test_lora_trains_and_its_peft_export_loads_in_transformers(family, tmp_path, trained_like):
    from aner_lang.runtime.tasks.data import from_texts
    from aner_lang.runtime.train.profile import profile
    from aner_lang.runtime.train.trainer import train

    peft = pytest.importorskip("peft")
    _, folder, _, _ = family
    model = load_model(folder, device="cpu")
    adapter = adapters.lora(model, rank=4, alpha=8.0, targets=_all(model), seed=1)
    run = train(adapter, from_texts(TEXTS, context=32), profile(), steps=6, learning_rate=1e-2)
    assert run.loss_history[-1] < run.loss_history[0]
    trained_like(adapter)
    out = save_adapter(adapter, tmp_path / "peft", format="peft")
    config = json.loads((out / "adapter_config.json").read_text())
    assert config["base_model_name_or_path"] == str(folder.absolute())
    ids = _ids(model, TEXTS[1])
    want = adapter.forward(ids)
    # PEFT loads the base by the name the export records: the adapter folder alone is enough
    theirs = peft.AutoPeftModelForCausalLM.from_pretrained(str(out), dtype=torch.float32).eval()
    with torch.no_grad():
        torch.testing.assert_close(theirs(ids).logits, want, atol=1e-4, rtol=1e-4)
    merged = merge(adapter)
    torch.testing.assert_close(merged.forward(ids), want, atol=1e-4, rtol=1e-4)


def test_merged_model_exports_back_to_its_architecture(family, tmp_path, trained_like):
    from aner_lang.runtime.export.gguf import export_gguf

    _, _, gguf, _ = family
    model = load_model(gguf, device="cpu")
    adapter = trained_like(adapters.lora(model, rank=2, alpha=4.0, targets=_all(model), seed=2))
    out = export_gguf(merge(adapter), tmp_path / "merged.gguf", dtype="f32")
    back = load_model(out, device="cpu")
    assert back.source_architecture == model.source_architecture
    ids = _ids(model)
    torch.testing.assert_close(back.forward(ids), adapter.forward(ids), atol=1e-4, rtol=1e-4)


def test_nf4_loads_stream_to_the_same_bytes_as_quantizing_the_dense_model(family):
    from aner_lang.runtime.nf4.quant import quantize_nf4

    _, folder, gguf, _ = family
    dense = load_model(folder, device="cpu")
    for path in (folder, gguf):
        nf4 = load_model(path, storage="nf4_double_quant", device="cpu")
        got = nf4.module.layers[1].self_attn.o_proj.weight_nf4
        want = quantize_nf4(dense.module.layers[1].self_attn.o_proj.dense_weight())
        assert torch.equal(got.packed, want.packed) and torch.equal(got.qabsmax, want.qabsmax)
        ids = _ids(dense)
        assert (nf4.forward(ids) - dense.forward(ids)).abs().max().item() < 2.0


def test_tinylora_rereads_unquantized_weights_from_either_source(family):
    _, folder, gguf, _ = family
    model = load_model(folder, device="cpu")
    first = _all(model)[:1]  # q_proj, or the fused qkv_proj
    dense = adapters.tinylora(model, parameters=3, rank=2, targets=first, seed=0)
    for path in (folder, gguf):
        nf4 = load_model(path, storage="nf4_double_quant", device="cpu")
        t = adapters.tinylora(nf4, parameters=3, rank=2, targets=first, seed=0)
        for key, value in dense.frozen.items():
            torch.testing.assert_close(t.frozen[key], value, atol=1e-5, rtol=1e-4)

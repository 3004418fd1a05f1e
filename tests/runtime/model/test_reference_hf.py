"""Our runtime against HF transformers, an implementation nobody here wrote.

The real SmolLM2 GGUF: logits within 1e-4 (fp32) and identical greedy tokens; tokenization and the
chat template as HF's GGUF tokenizer conversion reads the same vocabulary. Tiny fixtures cover the
untied-output path the real model does not have.
"""

from __future__ import annotations

import pytest
import torch

transformers = pytest.importorskip("transformers")

PROMPT = "The capital of France is"
TOKENIZER_CASES = [
    "The capital of France is",
    "Hello, world! 1234567 numbers: 3.14159 and 2,718",
    "  leading and  double  spaces\n\nnew lines\ttabs",
    "Unicode: café, naïve, 東京, emoji 🤗, Ünïcödé",
    "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n",
    "don't won't I'll they've we'd it's",
    "def f(x):\n    return x ** 2  # code",
]


@pytest.fixture(scope="module")
def hf_model(smollm2_path):
    return transformers.LlamaForCausalLM.from_pretrained(
        str(smollm2_path.parent), gguf_file=smollm2_path.name, dtype=torch.float32
    ).eval()


@pytest.fixture(scope="module")
def hf_tokenizer(smollm2_path):
    return transformers.AutoTokenizer.from_pretrained(
        str(smollm2_path.parent), gguf_file=smollm2_path.name
    )


def test_real_model_logits_match_hf(real_model, hf_model):
    ids = torch.tensor([real_model.tokenizer.encode(PROMPT)])
    with torch.no_grad():
        ours = real_model.forward(ids)
        theirs = hf_model(ids).logits
    assert ours.shape == theirs.shape == (1, ids.shape[1], 49152)
    assert (ours - theirs).abs().max().item() <= 1e-4


def test_real_model_greedy_generation_matches_hf(real_model, hf_model):
    from aner_lang.runtime.tasks.generate import Sampling, generate_ids

    prompt = real_model.tokenizer.encode(PROMPT)
    ours = generate_ids(real_model, prompt, Sampling(max_tokens=8, stop_at_eos=False))
    theirs = hf_model.generate(
        torch.tensor([prompt]), max_new_tokens=8, do_sample=False, min_new_tokens=8
    )[0, len(prompt) :].tolist()
    assert ours == theirs
    assert "Paris" in real_model.tokenizer.decode(ours)


@pytest.mark.parametrize("text", TOKENIZER_CASES)
def test_tokenizer_matches_hf_gguf_conversion(real_model, hf_tokenizer, text):
    ids = real_model.tokenizer.encode(text)
    assert ids == hf_tokenizer(text, add_special_tokens=True)["input_ids"]
    assert real_model.tokenizer.decode(ids) == hf_tokenizer.decode(ids)


def test_chat_template_matches_hf(real_model, hf_tokenizer):
    messages = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "What is 2 + 2?"},
    ]
    ours = real_model.tokenizer.apply_chat_template(messages, add_generation_prompt=True)
    theirs = hf_tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    assert ours == theirs
    assert (
        real_model.tokenizer.encode(ours, add_special=False)
        == hf_tokenizer(theirs, add_special_tokens=False)["input_ids"]
    )


@pytest.mark.parametrize("tied", [True, False])
def test_tiny_fixture_logits_match_hf(tmp_path, tied):
    from aner_lang.runtime.load.loader import load_model
    from aner_lang.testing.fixture import embedded_tokenizer, write_fixture

    path = write_fixture(
        tmp_path / "t.gguf", "tiny", seed=3, tied=tied, tokenizer=embedded_tokenizer()
    )
    ours = load_model(path, device="cpu")
    hf = transformers.LlamaForCausalLM.from_pretrained(
        str(tmp_path), gguf_file=path.name, dtype=torch.float32
    ).eval()
    assert hf.config.tie_word_embeddings == tied == ours.config.tie_word_embeddings
    ids = torch.tensor([ours.tokenizer.encode(TOKENIZER_CASES[1])])
    with torch.no_grad():
        assert (ours.forward(ids) - hf(ids).logits).abs().max().item() <= 1e-4

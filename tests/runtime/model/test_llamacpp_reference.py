"""Our tokenizer and chat template against llama.cpp itself, on the real SmolLM2 GGUF.

The expected values were produced by llama.cpp's server (the xllamacpp wheel) with
tests/runtime/model/data/make_llamacpp_reference.py; nobody here wrote them.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

REFERENCE = json.loads(
    (Path(__file__).parent / "data" / "llamacpp_reference.json").read_text(encoding="utf-8")
)


@pytest.mark.parametrize("case", REFERENCE["cases"], ids=lambda c: repr(c["text"][:24]))
def test_tokenization_matches_llama_cpp(real_model, case):
    tok = real_model.tokenizer
    assert tok.encode(case["text"]) == case["ids"]
    assert tok.encode(case["text"], parse_special=False) == case["ids_no_special"]
    assert tok.decode(case["ids"]) == case["decoded"]


def test_chat_template_matches_llama_cpp(real_model):
    chat = REFERENCE["chat"]
    assert real_model.tokenizer.apply_chat_template(chat["messages"]) == chat["prompt"]


def test_greedy_continuation_agrees_with_llama_cpp_up_to_near_ties(real_model):
    """llama.cpp runs Q4_1 weights with 8-bit quantized activations, we run dequantized fp32, so
    greedy paths may part at a near-tie; up to there they agree, and llama.cpp's pick there is a
    near-top choice of ours."""
    g = REFERENCE["greedy"]
    ids = real_model.tokenizer.encode(g["prompt"])
    agreed = 0
    cache = real_model.new_cache()
    step = torch.tensor([ids])
    with torch.no_grad():
        for theirs in g["tokens"]:
            logits = real_model.forward(step, cache)[0, -1]
            ours = int(logits.argmax())
            if ours != theirs:
                assert float(logits[ours] - logits[theirs]) < 1.0
                break
            agreed += 1
            step = torch.tensor([[ours]])
    assert agreed >= 4  # "Paris.\n\n" at least


SPM = json.loads(
    (Path(__file__).parent / "data" / "spm_reference.json").read_text(encoding="utf-8")
)


@pytest.fixture(scope="module")
def spm_tokenizer(tmp_path_factory):
    """The SentencePiece-style vocabulary, read back from a GGUF fixture that carries it."""
    from aner_lang.runtime.io.gguf import GGUFFile
    from aner_lang.runtime.model.tokenizer import Tokenizer
    from aner_lang.testing.fixture import write_fixture

    path = write_fixture(
        tmp_path_factory.mktemp("spm") / "spm.gguf", "tiny", tokenizer=SPM["tokenizer"]
    )
    return Tokenizer.from_gguf(GGUFFile(path))


@pytest.mark.parametrize("case", SPM["cases"], ids=lambda c: repr(c["text"][:24]))
def test_sentencepiece_vocabulary_matches_llama_cpp(spm_tokenizer, case):
    assert spm_tokenizer.encode(case["text"]) == case["ids"]
    assert spm_tokenizer.decode(case["ids"]) == case["decoded"]


def test_sentencepiece_vocabulary_agrees_with_sentencepiece_on_plain_text(spm_tokenizer):
    """Where SentencePiece's own normalizer does not rewrite the text (single spaces, no control
    text), llama.cpp, SentencePiece and we agree."""
    plain = [c for c in SPM["cases"] if c["ids"] == c["sentencepiece_ids"]]
    assert len(plain) >= 4
    for case in plain:
        assert spm_tokenizer.encode(case["text"]) == case["sentencepiece_ids"]

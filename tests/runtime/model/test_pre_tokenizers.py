"""Our GGUF byte-level BPE tokenizer against llama.cpp itself, for every pre-tokenizer name Aner
supports (Llama 3's llama-bpe, Qwen2's qwen2, Mistral's tekken, gpt-2, ...).

The expected ids and texts were produced by llama.cpp (the xllamacpp wheel) with
tests/runtime/model/data/make_bpe_reference.py; nobody here wrote them.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from aner_lang.problems.errors import AnerRuntimeError
from aner_lang.runtime.model.tokenizer import PRE_TOKENIZERS, Tokenizer

REFERENCE = json.loads(
    (Path(__file__).parent / "data" / "bpe_reference.json").read_text(encoding="utf-8")
)
CASES = [(pre, case) for pre, cases in REFERENCE["pre_tokenizers"].items() for case in cases]


def _tokenizer(pre: str) -> Tokenizer:
    return Tokenizer.from_metadata({**REFERENCE["tokenizer"], "tokenizer.ggml.pre": pre}, "ref")


def test_every_supported_pre_tokenizer_has_llama_cpp_vectors():
    assert set(REFERENCE["pre_tokenizers"]) == set(PRE_TOKENIZERS)


@pytest.mark.parametrize(("pre", "case"), CASES, ids=[f"{p}-{c['text'][:12]!r}" for p, c in CASES])
def test_tokenization_matches_llama_cpp(pre, case):
    tok = _tokenizer(pre)
    assert tok.encode(case["text"]) == case["ids"]
    assert tok.decode(case["ids"]) == case["decoded"]


def test_unknown_pre_tokenizer_is_named_with_the_known_ones():
    with pytest.raises(AnerRuntimeError) as info:
        _tokenizer("chameleon")
    err = info.value
    assert err.code == "E-TOKENIZER" and "'chameleon'" in err.message
    assert "llama-bpe" in err.notes[0] and "qwen2" in err.notes[0] and "tekken" in err.notes[0]

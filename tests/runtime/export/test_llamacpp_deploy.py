"""The deployable exports of a trained SmolLM2 adapter, run by their real consumer: llama.cpp's
server (xllamacpp) generates with the Q8_0 file, and with the LoRA file on the base, the greedy
text Aner generates with the merged model; the Q4_K_M file is llama.cpp's mix, read the same by
llama.cpp and Aner, and its distance from the merged model is measured."""

from __future__ import annotations

import pytest
import torch

from aner_lang.runtime.adapters import lora
from aner_lang.runtime.adapters.merge import merge
from aner_lang.runtime.export.gguf import export_gguf
from aner_lang.runtime.export.lora_gguf import export_lora_gguf
from aner_lang.runtime.load.loader import load_model
from aner_lang.runtime.tasks.data import from_texts
from aner_lang.runtime.tasks.generate import Sampling, generate_ids, generate_text
from aner_lang.runtime.train.profile import profile
from aner_lang.runtime.train.trainer import train
from aner_lang.testing.llamacpp import served

pytest.importorskip("xllamacpp")
pytestmark = pytest.mark.slow

TEXTS = [
    "Aner is a small typed language for adapting language models on your own machine.",
    "The lighthouse keeper counted seven ships before the storm reached the harbour.",
]
PROMPTS = ["Aner is a small typed", "The lighthouse keeper counted", "Aner is a"]
TOKENS = 16


@pytest.fixture(scope="module")
def trained(real_model):
    adapter = lora(real_model, rank=8, alpha=16.0, targets=["q_proj", "v_proj"], seed=1)
    data = from_texts(TEXTS, 32)
    run = train(adapter, data, profile(), steps=8, learning_rate=5e-3, micro_batch=2, seed=1)
    assert run.loss_history[-1] < 0.5 * run.loss_history[0]
    return adapter


@pytest.fixture(scope="module")
def merged(trained):
    return merge(trained)


@pytest.fixture(scope="module")
def expected(merged):
    return [generate_text(merged, p, Sampling(max_tokens=TOKENS)) for p in PROMPTS]


def _served(path, loras=()) -> list[str]:
    return served(path, PROMPTS, TOKENS, loras)


def test_the_trained_adapter_changes_what_the_model_says(real_model, expected) -> None:
    base = [generate_text(real_model, p, Sampling(max_tokens=TOKENS)) for p in PROMPTS]
    assert all(b != e for b, e in zip(base, expected)), (base, expected)


def test_q8_0_export_generates_the_merged_models_text(merged, expected, tmp_path) -> None:
    assert _served(export_gguf(merged, tmp_path / "merged-q8_0.gguf", dtype="q8_0")) == expected


def test_lora_gguf_on_the_base_generates_the_merged_models_text(
    real_model, trained, expected, tmp_path
) -> None:
    base = export_gguf(real_model, tmp_path / "base-f16.gguf", dtype="f16")
    adapter = export_lora_gguf(trained, tmp_path / "adapter.gguf")
    assert _served(base, loras=[adapter]) == expected


def test_q4_k_m_export_is_read_alike_by_llama_cpp_and_aner(merged, expected, tmp_path) -> None:
    path = export_gguf(merged, tmp_path / "merged-q4_k_m.gguf", dtype="q4_k_m")
    theirs = _served(path)
    ours = load_model(path, "float32", "cpu")
    assert theirs == [generate_text(ours, p, Sampling(max_tokens=TOKENS)) for p in PROMPTS]
    same = sum(t == e for t, e in zip(theirs, expected))
    print(f"q4_k_m: {same} of {len(PROMPTS)} greedy texts equal the merged model's")
    # its distance from the merged model: teacher-forced on the merged model's greedy tokens
    tok = merged.tokenizer
    gaps = []
    for prompt in PROMPTS:
        ids = tok.encode(prompt)
        new = generate_ids(merged, ids, Sampling(max_tokens=TOKENS))
        batch = torch.tensor([ids + new])
        span = slice(len(ids) - 1, -1)
        want, got = merged.forward(batch)[0, span], ours.forward(batch)[0, span]
        chosen = torch.tensor(new)[:, None]
        gap = want.log_softmax(-1).gather(1, chosen) - got.log_softmax(-1).gather(1, chosen)
        gaps.append(float(gap.abs().mean()))
        print(f"q4_k_m: {prompt!r}: mean |logprob gap| {gaps[-1]:.4f} over {len(new)} tokens")
    assert max(gaps) < 0.5

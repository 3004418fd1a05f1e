"""Train on the exact GGUF you serve: a LoRA trained on the real SmolLM2 Q4_1 kept as its own
blocks (`storage: gguf`), exported with `export_lora_gguf`, makes llama.cpp (xllamacpp's server,
the same Q4_1 file plus the LoRA file) generate greedily what Aner generates with the adapter."""

from __future__ import annotations

import pytest

from aner_lang.runtime.adapters import lora
from aner_lang.runtime.export.lora_gguf import export_lora_gguf
from aner_lang.runtime.load.loader import load_model
from aner_lang.runtime.tasks.data import from_texts
from aner_lang.runtime.tasks.generate import Sampling, generate_text
from aner_lang.runtime.train.memory import memory_report
from aner_lang.runtime.train.profile import profile
from aner_lang.runtime.train.trainer import train
from aner_lang.testing.llamacpp import served

pytest.importorskip("xllamacpp")
pytestmark = pytest.mark.slow

TEXTS = [
    "Aner is a small typed language for adapting language models on your own machine.",
    "The lighthouse keeper counted seven ships before the storm reached the harbour.",
]
PROMPTS = ["Aner is a small typed", "The lighthouse keeper counted"]
TOKENS = 8


@pytest.fixture(scope="module")
def base(smollm2_path):
    return load_model(smollm2_path, "gguf", "cpu")


@pytest.fixture(scope="module")
def trained(base):
    # q_proj and k_proj: their rows are the ones llama.cpp permutes, so the export must undo
    # the loader's un-permutation of the blocks exactly.
    adapter = lora(base, rank=8, alpha=16.0, targets=["q_proj", "k_proj", "v_proj"], seed=1)
    run = train(
        adapter,
        from_texts(TEXTS, 24),
        profile(),
        steps=4,
        learning_rate=5e-3,
        micro_batch=1,
        seed=1,
    )
    assert run.loss_history[-1] < run.loss_history[0]
    return adapter


def test_the_base_weighs_at_most_its_file(base, smollm2_path) -> None:
    report = memory_report(base)
    assert report.weights <= smollm2_path.stat().st_size
    assert report.packed_base > 0.99 * report.weights


def test_llama_cpp_with_the_lora_on_the_same_file_generates_what_aner_does(
    base, trained, smollm2_path, tmp_path
) -> None:
    ours = [generate_text(trained, p, Sampling(max_tokens=TOKENS)) for p in PROMPTS]
    plain = [generate_text(base, p, Sampling(max_tokens=TOKENS)) for p in PROMPTS]
    assert ours != plain  # the adapter changes what the model says
    adapter = export_lora_gguf(trained, tmp_path / "adapter.gguf")
    assert served(smollm2_path, PROMPTS, TOKENS, loras=[adapter]) == ours

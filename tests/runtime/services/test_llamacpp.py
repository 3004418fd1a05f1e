"""connect(...) against llama.cpp's real server (xllamacpp) on localhost: generate, chat and
evaluate agree with Aner running the same GGUF locally; the served model can be a merged export
of a trained adapter; a script that only uses services runs where torch is not installed."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from aner_lang.runtime.adapters import lora
from aner_lang.runtime.adapters.merge import merge
from aner_lang.runtime.export.gguf import export_gguf
from aner_lang.runtime.load.loader import load_model
from aner_lang.runtime.services import scoring, service
from aner_lang.runtime.tasks.data import from_texts
from aner_lang.runtime.tasks.evaluate import evaluate
from aner_lang.runtime.tasks.generate import Sampling, chat_text, generate_text
from aner_lang.runtime.train.profile import profile
from aner_lang.runtime.train.trainer import train

pytest.importorskip("xllamacpp")

PROMPTS = ["The capital of France is", "Once upon a time, a small robot"]
HELD_OUT = [
    "The quiet mountain lake reflects the clear morning sky.",
    "Seven engineers share one worktree and commit their own files.",
]


@pytest.fixture(scope="module")
def base_f16(real_model, tmp_path_factory) -> Path:
    return export_gguf(real_model, tmp_path_factory.mktemp("served") / "base-f16.gguf", "f16")


@pytest.fixture(scope="module")
def served(base_f16):
    from aner_lang.testing.llamacpp import llama_server

    with llama_server(base_f16) as url:
        yield url


@pytest.fixture(scope="module")
def local(base_f16):
    """The same file, run by Aner."""
    return load_model(base_f16, "float32", "cpu")


def test_generate_and_chat_match_aner_on_the_same_file(served, local) -> None:
    llm = service.connect(served)
    assert llm.model and llm.url == served
    for prompt in PROMPTS:
        assert service.generate(llm, prompt, max_tokens=16) == generate_text(
            local, prompt, Sampling(max_tokens=16)
        )
    message = "What is the capital of France?"
    assert service.chat(llm, message, max_tokens=16) == chat_text(
        local, message, None, Sampling(max_tokens=16)
    )


def test_evaluate_matches_aner_on_the_same_file(served, local) -> None:
    data = from_texts(HELD_OUT, 32)
    remote = scoring.evaluate(service.connect(served), data)
    here = evaluate(local, data)
    assert remote.scored_tokens == here.scored_tokens > 10
    assert remote.loss == pytest.approx(here.loss, abs=2e-3)


def test_the_real_smollm2_gguf_served_as_is(real_model, smollm2_path) -> None:
    from aner_lang.testing.llamacpp import llama_server

    data = from_texts(HELD_OUT, 32)
    with llama_server(smollm2_path) as url:
        llm = service.connect(url)
        text = service.generate(llm, PROMPTS[0], max_tokens=8)
        assert text and text == service.generate(llm, PROMPTS[0], max_tokens=8)
        remote = scoring.evaluate(llm, data)
    # llama.cpp multiplies Q4_1 weights by 8-bit quantized activations, Aner by fp32 ones
    # (the same file as f16 agrees to 2e-3 above): 0.085 nats apart on these texts
    assert remote.loss == pytest.approx(evaluate(real_model, data).loss, rel=0.02)


@pytest.mark.slow
def test_a_merged_export_of_a_trained_adapter_is_served(real_model, tmp_path) -> None:
    from aner_lang.testing.llamacpp import llama_server

    adapter = lora(real_model, rank=4, alpha=8.0, targets=["q_proj", "v_proj"], seed=3)
    train(adapter, from_texts(HELD_OUT, 32), profile(), steps=3, learning_rate=5e-3, micro_batch=2)
    merged = merge(adapter)
    with llama_server(export_gguf(merged, tmp_path / "merged-f16.gguf", "f16")) as url:
        llm = service.connect(url)
        for prompt in ["The quiet mountain", "Seven engineers"]:
            want = generate_text(merged, prompt, Sampling(max_tokens=12))
            assert want != generate_text(real_model, prompt, Sampling(max_tokens=12))
            assert service.generate(llm, prompt, max_tokens=12) == want


_NO_NATIVE = """
import sys, importlib.abc
BLOCKED = {"torch", "numpy", "gguf", "tokenizers", "safetensors", "jinja2", "xllamacpp"}
class Block(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name.split(".")[0] in BLOCKED:
            raise ModuleNotFoundError(f"No module named {name!r} (blocked)", name=name)
sys.meta_path.insert(0, Block())
from aner_lang.cli import main
sys.exit(main(sys.argv[1:]))
"""


def _without_native(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-c", _NO_NATIVE, *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=300,
        env=dict(os.environ),
    )


def test_a_services_only_script_runs_without_the_native_runtime(served, base_f16, tmp_path) -> None:
    script = tmp_path / "remote.aner"
    script.write_text(
        f'let llm = connect("{served}", timeout: 120.0)\n'
        'print(generate(llm, "The capital of France is", max_tokens: 4))\n'
        'let e = evaluate(llm, texts(["The quiet mountain lake."], context: 16))\n'
        'print("loss ${e.loss} over ${e.scored_tokens}")\n'
    )
    result = _without_native("run", str(script), cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    *generated, last = result.stdout.splitlines()
    assert "Paris" in generated[0] and last.startswith("loss ") and last.endswith(" over 5")

    native = tmp_path / "native.aner"
    (tmp_path / "model.gguf").symlink_to(base_f16)  # `aner check` looks at the file it names
    native.write_text(
        'print("before")\nlet m = load_model("model.gguf")\nprint(generate(m, "Hi"))\n'
    )
    refused = _without_native("run", str(native), cwd=tmp_path)
    assert refused.returncode == 1 and refused.stdout == ""
    assert (
        "native.aner:2:9: error[E-NATIVE-UNAVAILABLE]: native runtime not installed: "
        "`load_model` needs the Python package 'torch'" in refused.stderr
    )
    assert "1 more call(s) in this script need it too" in refused.stderr
    checked = _without_native("check", str(native), cwd=tmp_path)
    assert checked.returncode == 0 and "warning[W-NATIVE-UNAVAILABLE]" in checked.stderr

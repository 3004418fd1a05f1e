"""benchmarks/checkpointed_step.py runs a checkpointed LoRA call and prints what it measured."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("activations", ["checkpoint", "offload"])
def test_a_checkpointed_call_prints_its_speed_and_loss(tiny_bytes_gguf, activations):
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    out = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "checkpointed_step.py"),
         "--model", str(tiny_bytes_gguf), "--activations", activations,
         "--context", "32", "--updates", "2"],
        capture_output=True, text=True, env=env, timeout=300, check=True,
    ).stdout  # fmt: skip
    row = json.loads(out.strip().splitlines()[-1])
    assert row["activations"] == activations and row["updates"] == 2
    assert row["training_tokens_per_second"] > 0 and row["last_loss"] > 0

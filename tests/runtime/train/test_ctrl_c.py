"""Ctrl-C in a real `aner run`: the update in progress finishes, a checkpoint is written, one line
says how to resume, there is no traceback, and running the script again continues the run."""

from __future__ import annotations

import json
import re
import signal
from pathlib import Path

import pytest

from aner_lang.runtime.train import checkpoint
from aner_lang.testing.child import start_run, wait_for_updates

SCRIPT = """\
let base = load_model("{gguf}", storage: float32, device: cpu)
let data = texts(["Aner makes model adaptation explicit and reproducible.",
                  "The quiet mountain lake reflects the clear morning sky."], context: 24)
let a = resume("runs", model: base, otherwise: lora(base, rank: 2, alpha: 4.0, seed: 5))
let run = train(a, data, steps: 200, learning_rate: 0.01, checkpoints: "runs",
                checkpoint_every: 1000)
print("finished after ${run.updates} updates")
"""


@pytest.mark.slow
def test_ctrl_c_saves_a_checkpoint_and_says_how_to_resume(tiny_gguf, tmp_path):
    (tmp_path / "train.aner").write_text(SCRIPT.replace("{gguf}", str(tiny_gguf)))
    proc = start_run(tmp_path)
    events = tmp_path / "runs" / "events.jsonl"
    wait_for_updates(proc, events, 3)
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=300)
    assert proc.returncode == 130, err
    assert "Traceback" not in err and "finished" not in out
    found = re.search(
        r"train: interrupted after update (\d+) of 200; checkpoint saved in (\S+);", err
    )
    assert found, err
    updates = int(found.group(1))
    assert checkpoint.load(tmp_path / "runs").updates == updates
    assert Path(found.group(2)).is_dir()
    end = json.loads(events.read_text().splitlines()[-1])
    assert end["event"] == "end" and end["stopped"] == "interrupted" and end["update"] == updates

    again = start_run(tmp_path)  # the same script continues from the checkpoint
    out, err = again.communicate(timeout=600)
    assert again.returncode == 0, err
    assert "finished after 200 updates" in out
    starts = [json.loads(x) for x in events.read_text().splitlines() if '"start"' in x]
    assert starts[-1]["update"] == updates

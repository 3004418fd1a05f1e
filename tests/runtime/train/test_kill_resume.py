"""A real `aner run` killed with SIGKILL in the middle of training, then run again, ends
bit-identical to an uninterrupted run (the script resumes from its last checkpoint itself)."""

from __future__ import annotations

import signal
import subprocess
from pathlib import Path

import pytest
import torch

from aner_lang.runtime.train import checkpoint
from aner_lang.testing.child import start_run, wait_for_updates

SCRIPT = """\
let base = load_model("{gguf}", storage: float32, device: cpu)
let data = texts(["Aner makes model adaptation explicit and reproducible.",
                  "The quiet mountain lake reflects the clear morning sky.",
                  "Seven engineers share one worktree and commit their own files."], context: 24)
let a = resume("runs", model: base, otherwise: lora(base, rank: 2, alpha: 4.0, dropout: 0.1,
                                                     targets: [q_proj, v_proj], seed: 5))
let run = train(a, data, profile(), steps: 24, learning_rate: 0.01, micro_batch: 2,
                schedule: cosine, seed: 3, checkpoints: "runs", checkpoint_every: 4)
print("finished after ${run.updates} updates")
"""


def _setup(workdir: Path, gguf: Path) -> Path:
    workdir.mkdir()
    (workdir / "train.aner").write_text(SCRIPT.replace("{gguf}", str(gguf)))
    return workdir


def _finish(proc: subprocess.Popen[str]) -> None:
    out, err = proc.communicate(timeout=600)
    assert proc.returncode == 0, err[-3000:]
    assert "finished after 24 updates" in out


@pytest.mark.slow
def test_sigkilled_run_resumes_bit_identically(tiny_gguf, tmp_path):
    whole = _setup(tmp_path / "whole", tiny_gguf)
    _finish(start_run(whole))

    killed = _setup(tmp_path / "killed", tiny_gguf)
    proc = start_run(killed)
    # update 6 logged: past the checkpoint of update 4, inside update 7 or 8
    wait_for_updates(proc, killed / "runs" / "events.jsonl", 6)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    interrupted = checkpoint.load(killed / "runs")
    assert 4 <= interrupted.updates < 24

    _finish(start_run(killed))  # the same script, run again, picks up the last checkpoint
    a, b = checkpoint.load(whole / "runs"), checkpoint.load(killed / "runs")
    assert a.updates == b.updates == 24
    assert a.meta["counters"] == b.meta["counters"] and a.meta["loss_scale"] == b.meta["loss_scale"]
    assert set(a.tensors) == set(b.tensors)
    for key, t in a.tensors.items():
        assert torch.equal(b.tensors[key], t), key

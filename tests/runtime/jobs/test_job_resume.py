"""A submitted training job killed with SIGKILL in the middle of an update, and one cancelled
with `aner cancel`, each continued with `aner resume`, end bit-identical to an uninterrupted job
(the script has no resume logic of its own: the job's checkpoints carry it)."""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from aner_lang.problems.errors import EXIT_STOPPED
from aner_lang.runtime.jobs.store import CANCELLED, FINISHED, INTERRUPTED, JobStore
from aner_lang.runtime.train import checkpoint

SCRIPT = """\
let base = load_model("{gguf}", storage: float32, device: cpu)
let data = texts(["Aner makes model adaptation explicit and reproducible.",
                  "The quiet mountain lake reflects the clear morning sky.",
                  "Seven engineers share one worktree and commit their own files."], context: 24)
let a = lora(base, rank: 2, alpha: 4.0, dropout: 0.1, targets: [q_proj, v_proj], seed: 5)
let run = train(a, data, profile(), steps: 24, learning_rate: 0.01, micro_batch: 2,
                schedule: cosine, seed: 3)
save_adapter(a, "adapter", format: safetensors)
print("finished after ${run.updates} updates")
"""
STEPS = 24


def _submit(aner, folder: Path, gguf: Path) -> int:
    folder.mkdir()
    (folder / "train.aner").write_text(SCRIPT.replace("{gguf}", str(gguf)))
    result = aner("submit", "train.aner", "--checkpoint-every", "4", cwd=folder)
    assert result.returncode == 0, result.stderr
    return int(result.stdout)


def _when_updates_reach(store: JobStore, job_id: int, n: int) -> None:
    deadline = time.monotonic() + 600
    while time.monotonic() < deadline:
        job = store.get(job_id)
        assert job.active, (job.state, job.error)
        if (job.updates or 0) >= n:
            return
        time.sleep(0.01)
    raise AssertionError(f"job {job_id} did not reach update {n}")


def _events(store: JobStore, job_id: int) -> list[dict]:
    text = (Path(store.get(job_id).folder) / "events.jsonl").read_text()
    return [json.loads(line) for line in text.splitlines()]


@pytest.mark.slow
def test_killed_and_cancelled_jobs_resume_bit_identically(aner, tiny_gguf: Path, tmp_path: Path):
    store = JobStore()
    whole = _submit(aner, tmp_path / "whole", tiny_gguf)
    killed = _submit(aner, tmp_path / "killed", tiny_gguf)
    stopped = _submit(aner, tmp_path / "stopped", tiny_gguf)

    _when_updates_reach(store, killed, 6)  # past the checkpoint of update 4, inside update 7
    os.kill(store.get(killed).runner_pid, signal.SIGKILL)
    _when_updates_reach(store, stopped, 3)
    cancel = aner("cancel", str(stopped), "--wait")
    assert cancel.returncode == 0, cancel.stderr

    interrupted = store.get(killed)
    assert interrupted.state == INTERRUPTED and "SIGKILL" in (interrupted.error or "")
    cancelled = store.get(stopped)
    assert cancelled.state == CANCELLED and cancelled.exit_code == EXIT_STOPPED
    (stop,) = [e for e in _events(store, stopped) if e["event"] == "stopped"]
    at_stop = checkpoint.load(Path(cancelled.folder) / "checkpoints" / "train-1")
    assert at_stop.updates == stop["update"] == cancelled.updates and 3 <= at_stop.updates < STEPS

    for job_id in (killed, stopped):
        resumed = aner("resume", str(job_id), "--wait")
        assert resumed.returncode == 0, resumed.stderr
        assert store.get(job_id).attempt == 2
    assert aner("logs", "-f", str(whole)).returncode == 0

    reference = store.get(whole)
    ref_ck = checkpoint.load(Path(reference.folder) / "checkpoints" / "train-1")
    ref_adapter = load_file(tmp_path / "whole" / "adapter" / "adapter.safetensors")
    assert ref_ck.updates == STEPS
    for job_id, name in ((killed, "killed"), (stopped, "stopped")):
        job = store.get(job_id)
        assert job.state == FINISHED and job.updates == STEPS
        ck = checkpoint.load(Path(job.folder) / "checkpoints" / "train-1")
        assert ck.meta["counters"] == ref_ck.meta["counters"]
        assert ck.meta["loss_scale"] == ref_ck.meta["loss_scale"]
        assert set(ck.tensors) == set(ref_ck.tensors)
        for key, t in ref_ck.tensors.items():
            assert torch.equal(ck.tensors[key], t), (name, key)
        adapter = load_file(tmp_path / name / "adapter" / "adapter.safetensors")
        assert set(adapter) == set(ref_adapter)
        for key, t in ref_adapter.items():
            assert torch.equal(adapter[key], t), (name, key)
        events = _events(store, job_id)
        output = [e["text"] for e in events if e["event"] == "output"]
        assert f"finished after {STEPS} updates" in output
        # the second attempt continued from the first one's last checkpoint, not from update 1
        second = max(i for i, e in enumerate(events) if e["event"] == "attempt")
        saved = [e["update"] for e in events[:second] if e["event"] == "checkpoint"]
        updates = [e["update"] for e in events[second:] if e["event"] == "update"]
        assert saved and updates == list(range(saved[-1] + 1, STEPS + 1)), (name, saved, updates)

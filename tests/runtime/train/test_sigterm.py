"""SIGTERM stops a run as Ctrl-C does, wherever it arrives: during an update (the update finishes,
the checkpoint is written, the script ends with EXIT_STOPPED), during a `train` call's last
update (the call does not return: the script still stops), and between statements (no further
statement runs). Never a traceback."""

from __future__ import annotations

import json
import re
import signal

import pytest

from aner_lang.problems.errors import EXIT_STOPPED, RunStopped
from aner_lang.runtime.train import checkpoint
from aner_lang.testing.child import start_run, wait_for_updates

LOAD = """\
let base = load_model("{gguf}", storage: float32, device: cpu)
let data = texts(["Aner makes model adaptation explicit and reproducible.",
                  "The quiet mountain lake reflects the clear morning sky."], context: 24)
let a = lora(base, rank: 2, alpha: 4.0, seed: 5)
"""
DURING = (
    LOAD
    + """\
let run = train(a, data, steps: 200, learning_rate: 0.01, checkpoints: "runs",
                checkpoint_every: 1000)
print("finished after ${run.updates} updates")
"""
)
BETWEEN = (
    LOAD
    + """\
let first = train(a, data, steps: 1, learning_rate: 0.01, log: "events.jsonl")
print("trained")
for i in range(10000) {
  for j in range(10000) {
    let k = i + j
  }
}
let second = train(a, data, steps: 2, learning_rate: 0.01, log: "events.jsonl")
print("after")
"""
)


@pytest.mark.slow
def test_sigterm_during_training_checkpoints_and_stops_the_script(tiny_gguf, tmp_path):
    (tmp_path / "train.aner").write_text(DURING.replace("{gguf}", str(tiny_gguf)))
    proc = start_run(tmp_path)
    events = tmp_path / "runs" / "events.jsonl"
    wait_for_updates(proc, events, 3)
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=300)
    assert proc.returncode == EXIT_STOPPED, err
    assert "Traceback" not in err and "finished" not in out
    found = re.search(r"training stopped on request after update (\d+) of 200; checkpoint", err)
    assert found, err
    assert checkpoint.load(tmp_path / "runs").updates == int(found.group(1))
    end = json.loads(events.read_text().splitlines()[-1])
    assert end["event"] == "end" and end["stopped"] == "interrupted"


@pytest.mark.slow
def test_sigterm_between_train_calls_runs_no_further_statement(tiny_gguf, tmp_path, monkeypatch):
    (tmp_path / "train.aner").write_text(BETWEEN.replace("{gguf}", str(tiny_gguf)))
    monkeypatch.setenv("PYTHONUNBUFFERED", "1")  # "trained" reaches the test when printed
    proc = start_run(tmp_path)
    assert proc.stdout is not None
    assert proc.stdout.readline() == "trained\n"  # the script is in its loop now
    proc.send_signal(signal.SIGTERM)
    try:
        out, err = proc.communicate(timeout=120)
    finally:
        proc.kill()
    assert proc.returncode == EXIT_STOPPED, err
    assert "Traceback" not in err and "after" not in out
    assert "aner: run stopped on request (SIGTERM)" in err
    starts = (tmp_path / "events.jsonl").read_text().count('"event": "start"')
    assert starts == 1  # the second `train` never began


def test_sigterm_during_the_last_update_still_stops(tiny_model, monkeypatch):
    """The request outlives the `train` call it arrived in: a 1-step call whose one update was
    running when SIGTERM came does not return to the script."""
    from aner_lang.runtime import adapters
    from aner_lang.runtime.tasks.data import from_texts
    from aner_lang.runtime.train import trainer
    from aner_lang.runtime.train.profile import profile

    update = trainer._Loop.update

    def update_then_sigterm(self, ahead=False):  # the signal arrives while the update runs
        event = update(self, ahead)
        signal.raise_signal(signal.SIGTERM)
        return event

    monkeypatch.setattr(trainer._Loop, "update", update_then_sigterm)
    before = signal.getsignal(signal.SIGTERM)
    adapter = adapters.lora(tiny_model, rank=2, alpha=4.0, seed=1)
    data = from_texts(["Aner makes model adaptation explicit."], context=16)
    with pytest.raises(RunStopped, match="after update 1 of 1"):
        trainer.train(adapter, data, profile(), steps=1, learning_rate=1e-2)
    assert signal.getsignal(signal.SIGTERM) is before  # the previous handler is back

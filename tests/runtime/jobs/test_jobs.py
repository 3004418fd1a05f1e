"""The job database, GPU slots and the job commands, with scripts that need no model."""

from __future__ import annotations

import io
import json
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest

from aner_lang.check import analyze
from aner_lang.interp import ExecContext, run
from aner_lang.problems.errors import AnerRuntimeError
from aner_lang.runtime.jobs import manage
from aner_lang.runtime.jobs.processes import alive, identity
from aner_lang.runtime.jobs.store import (
    FINISHED,
    INTERRUPTED,
    RUNNING,
    WAITING,
    JobStore,
    gpu_count,
)


def _insert(store: JobStore, state: str, pid: int, needs_gpu: int = 0) -> int:
    return store.insert(
        script="/nowhere.aner",
        script_sha256="0",
        cwd="/",
        folder="/nowhere",
        state=state,
        needs_gpu=needs_gpu,
        checkpoint_every=10,
        created=time.time(),
        supervisor_pid=pid,
        supervisor_token=identity(pid),
    )


_CLIENT = """
import sys, time
from aner_lang.runtime.jobs.store import JobStore
store = JobStore()
for n in range(25):
    job = store.insert(script=f"/{sys.argv[1]}-{n}.aner", script_sha256="0", cwd="/", folder="",
                       state="finished", needs_gpu=0, checkpoint_every=1, created=time.time())
    store.update(job, updates=n, loss=float(sys.argv[1]))
    assert store.get(job).updates == n
"""


def test_concurrent_clients_each_see_their_own_writes(data_dir: Path) -> None:
    clients = [
        subprocess.Popen([sys.executable, "-c", _CLIENT, str(k)], stderr=subprocess.PIPE)
        for k in range(4)
    ]
    for c in clients:
        _, err = c.communicate(timeout=300)
        assert c.returncode == 0, err.decode()
    jobs = JobStore().all()
    assert len(jobs) == 100 and len({j.id for j in jobs}) == 100
    for j in jobs:
        client, n = j.script[1:-5].split("-")
        assert (j.updates, j.loss) == (int(n), float(client))


class _LockedOnce:
    """A connection whose first switch to WAL answers "database is locked" at once, as SQLite
    does when clients open a new database together."""

    def __init__(self, db: sqlite3.Connection, refusals: list[str]) -> None:
        self.db, self.refusals = db, refusals

    def execute(self, sql: str, *args: object) -> sqlite3.Cursor:
        if sql == "PRAGMA journal_mode=WAL" and not self.refusals:
            self.refusals.append(sql)
            raise sqlite3.OperationalError("database is locked")
        return self.db.execute(sql, *args)

    def close(self) -> None:
        self.db.close()


def test_opening_a_new_database_together_waits_for_the_others(
    data_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from aner_lang.runtime.jobs import store

    refusals: list[str] = []
    connect = sqlite3.connect
    monkeypatch.setattr(
        store.sqlite3, "connect", lambda *a, **k: _LockedOnce(connect(*a, **k), refusals)
    )
    db = JobStore()
    assert refusals == ["PRAGMA journal_mode=WAL"]  # refused once, then opened
    assert db.db.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    db.close()
    monkeypatch.setattr(store, "BUSY_SECONDS", 0.0)
    refusals.clear()
    (data_dir / "jobs.db").unlink()
    for leftover in data_dir.glob("jobs.db-*"):
        leftover.unlink()
    with pytest.raises(AnerRuntimeError, match="database is locked"):  # not forever
        JobStore()


def test_a_job_whose_supervisor_is_gone_is_interrupted_and_frees_its_gpu(data_dir: Path) -> None:
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    store = JobStore()
    job = _insert(store, RUNNING, gone.pid, needs_gpu=1)
    store.db.execute("INSERT INTO gpu_slots (gpu, job_id) VALUES (0, ?)", (job,))
    assert not alive(gone.pid, None)
    record = store.get(job)
    assert record.state == INTERRUPTED and "supervisor" in (record.error or "")
    assert store.db.execute("SELECT COUNT(*) FROM gpu_slots").fetchone()[0] == 0


def test_gpus_go_to_the_oldest_waiting_job_one_job_each(data_dir: Path) -> None:
    import os

    store = JobStore()
    first, second, third = (_insert(store, WAITING, os.getpid(), needs_gpu=1) for _ in range(3))
    assert store.claim_gpu(second, 1) is None  # the first job waits longer
    assert store.claim_gpu(first, 1) == 0
    assert store.claim_gpu(first, 1) == 0  # asking again keeps the same GPU
    store.update(first, state=RUNNING)
    assert store.claim_gpu(second, 1) is None  # the only GPU is held
    store.update(first, state=FINISHED)
    assert store.claim_gpu(second, 1) == 0  # freed when its holder ended
    store.update(second, state=RUNNING)
    assert store.claim_gpu(third, 2) == 1


def test_gpu_count_reads_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ANER_GPUS", "3")
    assert gpu_count() == 3
    monkeypatch.delenv("ANER_GPUS")
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "2,5")
    assert gpu_count() == 2
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "-1")
    assert gpu_count() == 0


@pytest.mark.parametrize(
    ("device", "wanted"), [("device: cpu", False), ("device: auto", True), ("", True)]
)
def test_a_script_wants_a_gpu_unless_it_loads_on_the_cpu(device: str, wanted: bool) -> None:
    args = ", ".join(a for a in ('"m.gguf"', device) if a)
    analysis = analyze(f"fn later() -> Model {{\n  return load_model({args})\n}}\n")
    assert not analysis.errors
    assert manage._wants_gpu(analysis) is wanted


def test_submit_refuses_a_script_that_does_not_check(aner, tmp_path: Path) -> None:
    script = tmp_path / "broken.aner"
    script.write_text('print(len("a", "b"))\n')
    result = aner("submit", str(script))
    assert result.returncode == 1
    assert "error[" in result.stderr and "no job was started" in result.stderr
    assert json.loads(aner("jobs", "--json").stdout) == []


def _hello(tmp_path: Path, text: str = "hello from a job") -> Path:
    script = tmp_path / "hello.aner"
    script.write_text(f'print("{text}")\n')
    return script


def test_a_submitted_script_runs_and_its_output_is_in_the_log(aner, tmp_path: Path) -> None:
    submitted = aner("submit", str(_hello(tmp_path)))
    assert submitted.returncode == 0, submitted.stderr
    job_id = submitted.stdout.strip()
    logs = aner("logs", "-f", job_id)
    assert logs.returncode == 0
    assert "[stdout] hello from a job" in logs.stdout
    assert logs.stdout.rstrip().endswith("finished exit_code=0")
    (listed,) = json.loads(aner("jobs", "--json").stdout)
    assert listed["id"] == int(job_id) and listed["state"] == FINISHED
    assert listed["device"] == "cpu" and listed["exit_code"] == 0
    table = aner("jobs").stdout.splitlines()
    assert table[0].split() == ["ID", "STATE", "PROGRESS", "LOSS", "STARTED", "DEVICE", "SCRIPT"]
    assert table[1].split()[:2] == [job_id, FINISHED]
    # a finished job can neither be cancelled nor resumed; an unknown one is named
    for command in ("cancel", "resume"):
        refused = aner(command, job_id)
        assert refused.returncode == 1 and "error[E-JOB-STATE]" in refused.stderr
    unknown = aner("logs", "999")
    assert unknown.returncode == 1 and "error[E-JOB-UNKNOWN]: there is no job 999" in unknown.stderr


def test_a_failed_job_keeps_its_diagnostic(aner, tmp_path: Path) -> None:
    script = tmp_path / "fails.aner"
    script.write_text("let xs = [1, 2]\nprint(xs[5])\n")
    job_id = aner("submit", str(script)).stdout.strip()
    aner("logs", "-f", job_id)
    (job,) = json.loads(aner("jobs", "--json").stdout)
    assert job["state"] == "failed" and job["exit_code"] == 1
    assert "error[E-INDEX]" in job["error"]


def test_a_job_waits_while_another_job_holds_the_only_gpu(
    aner, tmp_path: Path, tiny_gguf: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import os

    monkeypatch.setenv("ANER_GPUS", "1")
    store = JobStore()
    holder = _insert(store, RUNNING, os.getpid(), needs_gpu=1)
    store.db.execute("INSERT INTO gpu_slots (gpu, job_id) VALUES (0, ?)", (holder,))
    script = tmp_path / "gpu.aner"
    (tmp_path / "m.gguf").symlink_to(tiny_gguf)  # checked before the job runs
    script.write_text(
        'fn later() -> Model {\n  return load_model("m.gguf")\n}\nprint("had the gpu")\n'
    )
    job_id = int(aner("submit", str(script)).stdout)
    deadline = time.monotonic() + 120
    while store.get(job_id).state != WAITING and time.monotonic() < deadline:
        time.sleep(0.1)
    assert store.get(job_id).state == WAITING
    store.update(holder, state=FINISHED)
    done = manage.wait(store, job_id, timeout=300)
    assert done.state == FINISHED and done.device == "cuda:0"
    logs = aner("logs", str(job_id)).stdout
    assert "waiting reason=every GPU is held by another job" in logs
    assert "[stdout] had the gpu" in logs


def test_a_script_submits_a_job_and_waits_for_it(tmp_path: Path) -> None:
    _hello(tmp_path, "inner job")
    source = (
        'let job = submit("hello.aner")\n'
        "let done = wait(job, timeout: 300.0)\n"
        'print("${done.id} ${done.state} ${done.device} ${done.error}")\n'
    )
    analysis = analyze(source, str(tmp_path / "outer.aner"))
    assert not analysis.errors, analysis.errors
    out = io.StringIO()
    run(analysis, ExecContext(script_dir=tmp_path, stdout=out))
    job_id, state, device, error = out.getvalue().split()
    assert (state, device, error) == (FINISHED, "cpu", "none")
    assert "inner job" in (Path(JobStore().get(int(job_id)).folder) / "events.jsonl").read_text()

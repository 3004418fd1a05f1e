"""What can be done to jobs: submit, cancel, resume, wait. The `aner` subcommands and the
script builtins (`submit`, `wait`, `cancel`) both call these.

A job is a script run by `aner run` in a process of its own, under a supervisor process (see
`supervisor`) that starts detached from the submitting terminal, waits for a GPU when the script
needs one, records progress and the outcome in the job database, and keeps the job's event log.
"""

from __future__ import annotations

import hashlib
import os
import signal
import sys
import time
from pathlib import Path

from aner_lang.check import Analysis, analyze
from aner_lang.problems.errors import AnerRuntimeError
from aner_lang.runtime.jobs.processes import alive, identity, spawn_detached
from aner_lang.runtime.jobs.store import (
    ACTIVE,
    DATA_DIR_ENV,
    QUEUED,
    RESUMABLE,
    RUNNING,
    JobRecord,
    JobStore,
    gpu_count,
)

DEFAULT_CHECKPOINT_EVERY = 10
SUPERVISOR_LOG = "supervisor.log"


class ScriptRejected(Exception):
    """The script does not check; its diagnostics are in `analysis`."""

    def __init__(self, analysis: Analysis) -> None:
        super().__init__(f"{analysis.path} has errors")
        self.analysis = analysis


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _wants_gpu(a: Analysis) -> bool:
    """Whether the script loads a model on a device other than a literal `cpu` (`auto`, the
    default, uses a GPU where there is one)."""
    for info in a.calls.values():
        if info.kind == "builtin" and info.name == "load_model":
            device = dict(info.bound).get("device")
            if device is None or a.enum_values.get(id(device)) != ("Device", "cpu"):
                return True
    return any(_wants_gpu(sub) for sub in a.imports.values())


def _read_script(script: Path) -> str:
    try:
        return script.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise AnerRuntimeError(
            f"cannot read the script {script}: {getattr(e, 'strerror', None) or e}",
            code="E-IO",
        ) from None


def submit(
    store: JobStore,
    script: Path,
    *,
    checkpoint_every: int = DEFAULT_CHECKPOINT_EVERY,
    cwd: Path | None = None,
) -> JobRecord:
    """Check `script` and start it as a background job; raises `ScriptRejected` when it does
    not check (nothing is started then)."""
    script = script.resolve()
    analysis = analyze(_read_script(script), str(script))
    if analysis.errors:
        raise ScriptRejected(analysis)
    job_id = store.insert(
        script=str(script),
        script_sha256=_sha256(script),
        cwd=str((cwd or Path.cwd()).resolve()),
        folder="",
        state=QUEUED,
        needs_gpu=int(_wants_gpu(analysis) and gpu_count() > 0),
        checkpoint_every=checkpoint_every,
        created=time.time(),
        # until the supervisor runs, this process answers for the job
        supervisor_pid=os.getpid(),
        supervisor_token=identity(os.getpid()),
    )
    folder = store.jobs_folder(job_id)
    store.update(job_id, folder=str(folder))
    _start_supervisor(store, job_id, folder)
    return store.get(job_id)


def _start_supervisor(store: JobStore, job_id: int, folder: Path) -> None:
    env = {**os.environ, DATA_DIR_ENV: str(store.root)}
    proc = spawn_detached(
        [sys.executable, "-m", "aner_lang.runtime.jobs.supervisor", str(job_id)],
        env=env,
        log=folder / SUPERVISOR_LOG,
    )
    store.update(job_id, supervisor_pid=proc.pid, supervisor_token=identity(proc.pid))


def cancel(store: JobStore, job_id: int) -> JobRecord:
    """Ask an active job to stop: a running script finishes its current update, writes a
    checkpoint and ends; a job waiting for a GPU ends at once."""
    store.transition(job_id, ACTIVE, cancel_requested=1)
    job = store.get(job_id)
    if not job.active:
        raise AnerRuntimeError(
            f"job {job_id} is {job.state}: there is nothing to cancel", code="E-JOB-STATE"
        )
    if job.state == RUNNING and alive(job.runner_pid, job.runner_token):
        assert job.runner_pid is not None
        os.kill(job.runner_pid, signal.SIGTERM)
    return job


def resume(store: JobStore, job_id: int) -> JobRecord:
    """Start a failed, cancelled or interrupted job again: the script runs from its start and
    every `train` call continues from its latest checkpoint (`runtime.train.control`)."""
    job = store.get(job_id)
    if job.state not in RESUMABLE:
        raise AnerRuntimeError(
            f"job {job_id} is {job.shown_state}; only a failed, cancelled or interrupted job "
            "can be resumed",
            code="E-JOB-STATE",
        )
    script = Path(job.script)
    if not script.is_file() or _sha256(script) != job.script_sha256:
        raise AnerRuntimeError(
            f"job {job_id}: its script {script} changed or disappeared since it was submitted",
            code="E-JOB-STATE",
            notes=(
                "resuming continues the checkpoints of the script as submitted; submit the "
                "changed script as a new job",
            ),
        )
    resumed = store.transition(
        job_id,
        RESUMABLE,
        state=QUEUED,
        attempt=job.attempt + 1,
        cancel_requested=0,
        ended=None,
        exit_code=None,
        error=None,
        runner_pid=None,
        runner_token=None,
        supervisor_pid=os.getpid(),  # until the supervisor runs, this process answers for it
        supervisor_token=identity(os.getpid()),
    )
    if not resumed:
        raise AnerRuntimeError(
            f"job {job_id} is {store.get(job_id).shown_state} now (resumed by another client?)",
            code="E-JOB-STATE",
        )
    _start_supervisor(store, job_id, Path(job.folder))
    return store.get(job_id)


def wait(
    store: JobStore, job_id: int, timeout: float | None = None, poll: float = 0.2
) -> JobRecord:
    """The job once it is no longer active (raises E-JOB-TIMEOUT after `timeout` seconds)."""
    deadline = None if timeout is None else time.monotonic() + timeout
    while True:
        job = store.get(job_id)
        if not job.active:
            return job
        if deadline is not None and time.monotonic() >= deadline:
            raise AnerRuntimeError(
                f"job {job_id} is still {job.shown_state} after {timeout:g} s",
                code="E-JOB-TIMEOUT",
                notes=("wait longer, or follow it with `aner logs -f`",),
            )
        time.sleep(poll)

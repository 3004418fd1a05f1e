"""The job builtins a script calls (declared in `aner_lang.builtins.jobs`): `submit`, `wait`,
`cancel`, and the `Job` value they return."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from aner_lang.problems.errors import AnerRuntimeError
from aner_lang.runtime.jobs import manage
from aner_lang.runtime.jobs.store import JobRecord, JobStore


class Job:
    """An Aner `Job`: a job id in a job database; each field is read from the database."""

    def __init__(self, root: Path, job_id: int) -> None:
        self.root, self.id = root, job_id

    def record(self) -> JobRecord:
        store = JobStore(self.root)
        try:
            return store.get(self.id)
        finally:
            store.close()

    @property
    def state(self) -> str:
        return self.record().shown_state

    @property
    def script(self) -> str:
        return self.record().script

    @property
    def updates(self) -> int | None:
        return self.record().updates

    @property
    def steps(self) -> int | None:
        return self.record().steps

    @property
    def loss(self) -> float | None:
        return self.record().loss

    @property
    def device(self) -> str | None:
        return self.record().device

    @property
    def error(self) -> str | None:
        return self.record().error

    def __repr__(self) -> str:
        return f"Job({self.id}, {self.state})"


def _with_store(fn: Any, *args: Any, root: Path | None = None) -> JobRecord:
    store = JobStore(root)
    try:
        record: JobRecord = fn(store, *args)
        return record
    finally:
        store.close()


def submit_builtin(ctx: Any, *, script: str, checkpoint_every: int) -> Job:
    """Builtin `submit`: `script` is relative to the calling script; it runs from there too."""
    path = ctx.resolve_path(script)
    store = JobStore()
    try:
        record = manage.submit(store, path, checkpoint_every=checkpoint_every, cwd=ctx.script_dir)
    except manage.ScriptRejected as e:
        first = e.analysis.errors[0]
        raise AnerRuntimeError(
            f"submit: {path} has errors; no job was started",
            code="E-JOB-SCRIPT",
            notes=(f"{first.path}:{first.span.line if first.span else 1}: {first.message}",),
        ) from None
    finally:
        store.close()
    return Job(store.root, record.id)


def wait_builtin(*, job: Job, timeout: float | None) -> Job:
    """Builtin `wait`."""
    _with_store(manage.wait, job.id, timeout, root=job.root)
    return job


def cancel_builtin(*, job: Job) -> Job:
    """Builtin `cancel`."""
    _with_store(manage.cancel, job.id, root=job.root)
    return job

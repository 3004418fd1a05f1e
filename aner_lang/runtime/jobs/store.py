"""The job database: one SQLite file under the user's data directory.

Every `aner` process that touches jobs (`submit`, `jobs`, `logs`, `cancel`, `resume`, a job's
supervisor, a script calling `submit(...)`) opens the same database. It runs in WAL mode, so
readers never block the writer; every change is one short `BEGIN IMMEDIATE` transaction, and a
busy database is waited on (`busy_timeout`), so any number of clients may act at once.

A job whose supervisor process is gone while the job still counts as active (a crash, a reboot,
a SIGKILL) is marked `interrupted` by whichever client looks next (`reconcile`), and the GPU slot
it held is freed. Processes are recognised by pid and start time, so a reused pid is not taken for
the supervisor.

GPU slots: a job that needs CUDA holds one GPU while it runs (table `gpu_slots`); jobs wanting a
GPU take free ones in submission order and otherwise wait, so jobs never oversubscribe a GPU.
"""

from __future__ import annotations

import os
import sqlite3
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

from aner_lang.problems.errors import AnerRuntimeError
from aner_lang.runtime.jobs.processes import alive

DATA_DIR_ENV = "ANER_DATA_DIR"
GPUS_ENV = "ANER_GPUS"
SCHEMA_VERSION = 1

QUEUED, WAITING, RUNNING = "queued", "waiting", "running"
FINISHED, FAILED, CANCELLED, INTERRUPTED = "finished", "failed", "cancelled", "interrupted"
ACTIVE = (QUEUED, WAITING, RUNNING)
RESUMABLE = (FAILED, CANCELLED, INTERRUPTED)

_SCHEMA = """
CREATE TABLE IF NOT EXISTS jobs (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    script TEXT NOT NULL,
    script_sha256 TEXT NOT NULL,
    cwd TEXT NOT NULL,
    folder TEXT NOT NULL,
    state TEXT NOT NULL,
    needs_gpu INTEGER NOT NULL,
    checkpoint_every INTEGER NOT NULL,
    attempt INTEGER NOT NULL DEFAULT 1,
    created REAL NOT NULL,
    started REAL,
    ended REAL,
    device TEXT,
    supervisor_pid INTEGER,
    supervisor_token TEXT,
    runner_pid INTEGER,
    runner_token TEXT,
    cancel_requested INTEGER NOT NULL DEFAULT 0,
    train_call INTEGER,
    updates INTEGER,
    steps INTEGER,
    loss REAL,
    exit_code INTEGER,
    error TEXT
);
CREATE TABLE IF NOT EXISTS gpu_slots (
    gpu INTEGER PRIMARY KEY,
    job_id INTEGER NOT NULL
);
"""


def data_dir() -> Path:
    """Where Aner keeps user data: `ANER_DATA_DIR`, else `$XDG_DATA_HOME/aner`, else
    ``~/.local/share/aner``."""
    explicit = os.environ.get(DATA_DIR_ENV)
    if explicit:
        return Path(explicit).expanduser()
    xdg = os.environ.get("XDG_DATA_HOME")
    return (Path(xdg).expanduser() if xdg else Path.home() / ".local" / "share") / "aner"


def gpu_count() -> int:
    """GPUs jobs may use: `ANER_GPUS` if set; else the entries of `CUDA_VISIBLE_DEVICES` if set;
    else the NVIDIA GPUs the driver lists (no CUDA library is loaded to count them)."""
    explicit = os.environ.get(GPUS_ENV)
    if explicit is not None and explicit.strip():
        return max(0, int(explicit))
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:
        entries = [v for v in visible.split(",") if v.strip()]
        return 0 if entries[:1] == ["-1"] else len(entries)
    listed = Path("/proc/driver/nvidia/gpus")
    return len(list(listed.iterdir())) if listed.is_dir() else 0


@dataclass(frozen=True)
class JobRecord:
    """One row of the `jobs` table."""

    id: int
    script: str
    script_sha256: str
    cwd: str
    folder: str
    state: str
    needs_gpu: int
    checkpoint_every: int
    attempt: int
    created: float
    started: float | None
    ended: float | None
    device: str | None
    supervisor_pid: int | None
    supervisor_token: str | None
    runner_pid: int | None
    runner_token: str | None
    cancel_requested: int
    train_call: int | None
    updates: int | None
    steps: int | None
    loss: float | None
    exit_code: int | None
    error: str | None

    @property
    def active(self) -> bool:
        return self.state in ACTIVE

    @property
    def shown_state(self) -> str:
        """The state as listed: an active job asked to stop shows as `cancelling`."""
        return "cancelling" if self.active and self.cancel_requested else self.state


_COLUMNS = tuple(f.name for f in fields(JobRecord))


class JobStore:
    """The job database (see the module docstring). Open one per process or thread."""

    def __init__(self, root: Path | None = None) -> None:
        self.root = root if root is not None else data_dir()
        self.path = self.root / "jobs.db"
        try:
            self.root.mkdir(parents=True, exist_ok=True)
            self.db = _open(self.path)
            with self.write():
                if self.db.execute("PRAGMA user_version").fetchone()[0] == 0:
                    for statement in _SCHEMA.split(";"):
                        self.db.execute(statement)
                    self.db.execute(f"PRAGMA user_version={SCHEMA_VERSION}")
        except (OSError, sqlite3.Error) as e:
            raise _store_error(self.path, e) from None

    def close(self) -> None:
        self.db.close()

    def jobs_folder(self, job_id: int) -> Path:
        return self.root / "jobs" / str(job_id)

    @contextmanager
    def write(self) -> Iterator[sqlite3.Connection]:
        """One write transaction, taken at once (`BEGIN IMMEDIATE`): concurrent writers queue."""
        try:
            self.db.execute("BEGIN IMMEDIATE")
        except sqlite3.Error as e:
            raise _store_error(self.path, e) from None
        try:
            yield self.db
        except BaseException:
            self.db.execute("ROLLBACK")
            raise
        self.db.execute("COMMIT")

    # -- reading ----------------------------------------------------------------------------
    def get(self, job_id: int) -> JobRecord:
        self.reconcile()
        row = self.db.execute(
            f"SELECT {', '.join(_COLUMNS)} FROM jobs WHERE id = ?", (job_id,)
        ).fetchone()
        if row is None:
            raise AnerRuntimeError(
                f"there is no job {job_id}",
                code="E-JOB-UNKNOWN",
                notes=(f"jobs are listed by `aner jobs` (database: {self.path})",),
            )
        return JobRecord(*row)

    def all(self) -> list[JobRecord]:
        self.reconcile()
        rows = self.db.execute(f"SELECT {', '.join(_COLUMNS)} FROM jobs ORDER BY id").fetchall()
        return [JobRecord(*r) for r in rows]

    # -- writing ----------------------------------------------------------------------------
    def insert(self, **values: Any) -> int:
        names = ", ".join(values)
        marks = ", ".join("?" for _ in values)
        with self.write() as db:
            cursor = db.execute(
                f"INSERT INTO jobs ({names}) VALUES ({marks})", tuple(values.values())
            )
        assert cursor.lastrowid is not None
        return cursor.lastrowid

    def update(self, job_id: int, **values: Any) -> None:
        with self.write() as db:
            self._set(db, job_id, values)

    def transition(self, job_id: int, states: tuple[str, ...], **values: Any) -> bool:
        """Set `values` if the job is in one of `states`, in one transaction (so two clients
        cannot both resume or both start a job); whether it was."""
        with self.write() as db:
            row = db.execute("SELECT state FROM jobs WHERE id = ?", (job_id,)).fetchone()
            if row is None or row[0] not in states:
                return False
            self._set(db, job_id, values)
            return True

    @staticmethod
    def _set(db: sqlite3.Connection, job_id: int, values: dict[str, Any]) -> None:
        assignments = ", ".join(f"{k} = ?" for k in values)
        db.execute(f"UPDATE jobs SET {assignments} WHERE id = ?", (*values.values(), job_id))

    def reconcile(self) -> None:
        """Mark active jobs whose supervisor is gone `interrupted`; free GPU slots whose job is
        no longer active."""
        rows = self.db.execute(
            "SELECT id, supervisor_pid, supervisor_token FROM jobs WHERE state IN (?, ?, ?)",
            ACTIVE,
        ).fetchall()
        dead = [job_id for job_id, pid, token in rows if not alive(pid, token)]
        stale = self.db.execute(
            "SELECT gpu FROM gpu_slots WHERE job_id NOT IN "
            "(SELECT id FROM jobs WHERE state IN (?, ?, ?))",
            ACTIVE,
        ).fetchall()
        if not dead and not stale:
            return
        with self.write() as db:
            for job_id in dead:  # re-checked inside the transaction: another client may have won
                pid, token, state = db.execute(
                    "SELECT supervisor_pid, supervisor_token, state FROM jobs WHERE id = ?",
                    (job_id,),
                ).fetchone()
                if state in ACTIVE and not alive(pid, token):
                    self._set(
                        db,
                        job_id,
                        {
                            "state": INTERRUPTED,
                            "ended": time.time(),
                            "error": "its supervisor process ended without recording an outcome "
                            "(a crash, a reboot or a kill); `aner resume` continues it",
                        },
                    )
            db.execute(
                "DELETE FROM gpu_slots WHERE job_id NOT IN "
                "(SELECT id FROM jobs WHERE state IN (?, ?, ?))",
                ACTIVE,
            )

    def claim_gpu(self, job_id: int, count: int) -> int | None:
        """A free GPU index for `job_id`, or None while older waiting jobs or other running jobs
        hold them all (oldest waiting job first, so none starves)."""
        self.reconcile()
        with self.write() as db:
            held = dict(db.execute("SELECT gpu, job_id FROM gpu_slots").fetchall())
            for gpu, holder in held.items():
                if holder == job_id:
                    return gpu
            older = db.execute(
                "SELECT COUNT(*) FROM jobs WHERE state = ? AND needs_gpu = 1 AND id < ?",
                (WAITING, job_id),
            ).fetchone()[0]
            free = [g for g in range(count) if g not in held]
            if older or not free:
                return None
            db.execute("INSERT INTO gpu_slots (gpu, job_id) VALUES (?, ?)", (free[0], job_id))
            return free[0]

    def release_gpu(self, job_id: int) -> None:
        with self.write() as db:
            db.execute("DELETE FROM gpu_slots WHERE job_id = ?", (job_id,))


BUSY_SECONDS = 30.0
"""How long a client waits for a busy database, opening it included."""


def _open(path: Path) -> sqlite3.Connection:
    """A connection in WAL mode that waits `BUSY_SECONDS` for a busy database.

    Rule: switching a new file to WAL needs it alone, and SQLite answers "database is locked" at
    once, without its busy wait, when clients open a new database together (a lock it cannot
    wait for without deadlocking); such an opening is tried again, until `BUSY_SECONDS`."""
    deadline = time.monotonic() + BUSY_SECONDS
    while True:
        db = sqlite3.connect(path, timeout=BUSY_SECONDS, isolation_level=None)
        try:
            if db.execute("PRAGMA journal_mode").fetchone()[0] != "wal":
                db.execute("PRAGMA journal_mode=WAL")
            return db
        except sqlite3.OperationalError as e:
            db.close()
            if "locked" not in str(e) or time.monotonic() >= deadline:
                raise
            time.sleep(0.05)


def _store_error(path: Path, e: BaseException) -> AnerRuntimeError:
    return AnerRuntimeError(
        f"cannot use the job database {path}: {e}",
        code="E-JOB-STORE",
        notes=(
            "set ANER_DATA_DIR to a writable folder on a local disk, or move a damaged "
            "jobs.db aside",
        ),
    )

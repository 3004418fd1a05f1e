"""A job's supervisor: ``python -m aner_lang.runtime.jobs.supervisor JOB_ID``.

Started detached by `manage.submit`/`manage.resume`, it:

1. waits for a GPU slot when the job needs one (`JobStore.claim_gpu`), ending at once if the job
   is cancelled meanwhile;
2. runs the script with ``python -m aner_lang.cli run SCRIPT`` in the directory it was submitted
   from, with the variables of `runtime.train.job_env` (job folder, checkpoint interval,
   resume flag, the write end of an events pipe) and `CUDA_VISIBLE_DEVICES` naming its GPU;
3. writes everything the script says (trainer events from the pipe, stdout and stderr lines) to
   the job's event log, and each update's progress (update, steps, loss) to the job database;
4. records the outcome from the script's exit: `finished` (0), `cancelled` (asked to stop),
   `interrupted` (stopped or killed by a signal: resumable), `failed` (an error; its diagnostic
   is kept as the job's error), then frees the GPU.

If the supervisor itself dies, the next client to read the database marks the job
`interrupted` (`JobStore.reconcile`).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from collections import deque
from pathlib import Path
from typing import IO, Any

from aner_lang.host import json_text
from aner_lang.problems.errors import EXIT_STOPPED
from aner_lang.runtime.jobs.events import PIECE_LIMIT, EventLog
from aner_lang.runtime.jobs.processes import identity
from aner_lang.runtime.jobs.store import (
    CANCELLED,
    FAILED,
    FINISHED,
    INTERRUPTED,
    QUEUED,
    RUNNING,
    WAITING,
    JobRecord,
    JobStore,
    gpu_count,
)
from aner_lang.runtime.train import job_env

_POLL_SECONDS = 0.5
_ERROR_LINES = 12


class Supervisor:
    def __init__(self, store: JobStore, job: JobRecord, log: EventLog) -> None:
        self.store, self.job, self.log = store, job, log
        self.stderr_tail: deque[str] = deque(maxlen=_ERROR_LINES)

    def cancelled(self) -> bool:
        return bool(self.store.get(self.job.id).cancel_requested)

    def run(self) -> None:
        job = self.job
        self.log.write({"event": "attempt", "attempt": job.attempt, "script": job.script})
        env = {**os.environ}
        device = "cpu"
        if job.needs_gpu:
            gpu = self.wait_for_gpu()
            if gpu is None:
                return self.finish(CANCELLED, None, "cancelled while waiting for a GPU")
            physical = _physical_gpu(gpu)
            env["CUDA_VISIBLE_DEVICES"] = physical
            device = f"cuda:{physical}"
        if self.cancelled():
            return self.finish(CANCELLED, None, "cancelled before it started")
        read_end, write_end = os.pipe()
        env.update(
            {
                job_env.JOB_DIR: job.folder,
                job_env.JOB_CHECKPOINT_EVERY: str(job.checkpoint_every),
                job_env.JOB_RESUME: "1" if job.attempt > 1 else "0",
                job_env.JOB_EVENTS_FD: str(write_end),
                "PYTHONUNBUFFERED": "1",
            }
        )
        child = subprocess.Popen(
            [sys.executable, "-m", "aner_lang.cli", "run", job.script],
            cwd=job.cwd,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            pass_fds=(write_end,),
        )
        os.close(write_end)
        self.store.transition(
            job.id,
            (QUEUED, WAITING),
            state=RUNNING,
            started=time.time(),
            device=device,
            runner_pid=child.pid,
            runner_token=identity(child.pid),
        )
        self.log.write({"event": "started", "device": device, "pid": child.pid})
        if self.cancelled():  # a cancel that came before the runner's pid was recorded
            child.send_signal(signal.SIGTERM)
        assert child.stdout is not None and child.stderr is not None
        pumps = [
            threading.Thread(target=self.pump_output, args=(child.stdout, "stdout")),
            threading.Thread(target=self.pump_output, args=(child.stderr, "stderr")),
            threading.Thread(target=self.pump_events, args=(read_end,)),
        ]
        for t in pumps:
            t.start()
        code = child.wait()
        for t in pumps:
            t.join()
        self.finish(*self.outcome(code))

    def wait_for_gpu(self) -> int | None:
        """A GPU index once one is free for this job; None if it is cancelled first."""
        self.store.transition(self.job.id, (QUEUED,), state=WAITING)
        count, told = gpu_count(), False
        while True:
            gpu = self.store.claim_gpu(self.job.id, count)
            if gpu is not None:
                return gpu
            if self.cancelled():
                return None
            if not told:
                self.log.write({"event": "waiting", "reason": "every GPU is held by another job"})
                told = True
            time.sleep(_POLL_SECONDS)

    def pump_output(self, stream: IO[bytes], name: str) -> None:
        for raw in iter(lambda: stream.readline(PIECE_LIMIT), b""):
            text = raw.decode("utf-8", errors="replace").rstrip("\n")
            if name == "stderr" and text.strip():
                self.stderr_tail.append(text)
            self.log.write({"event": "output", "stream": name, "text": text})

    def pump_events(self, fd: int) -> None:
        """Trainer events: logged, and each update's progress recorded (its own connection:
        SQLite connections stay in the thread that opened them)."""
        store = JobStore(self.store.root)
        try:
            with os.fdopen(fd, "r", encoding="utf-8") as stream:
                for line in iter(lambda: stream.readline(PIECE_LIMIT), ""):
                    try:
                        event: dict[str, Any] = json_text.loads(line)
                    except ValueError:
                        continue
                    self.log.write(event)
                    if event.get("event") == "update":
                        store.update(
                            self.job.id,
                            train_call=event.get("train"),
                            updates=event.get("update"),
                            steps=event.get("steps"),
                            loss=event.get("loss"),
                        )
        finally:
            store.close()

    def outcome(self, code: int) -> tuple[str, int, str | None]:
        if code == 0:
            return FINISHED, code, None
        if self.cancelled():
            return CANCELLED, code, "cancelled on request"
        if code < 0 or code == EXIT_STOPPED:
            how = signal.Signals(-code).name if code < 0 else "a stop request"
            return INTERRUPTED, code, f"the script's process was ended by {how}"
        errors = [line for line in self.stderr_tail if "error[" in line]
        return FAILED, code, (errors or list(self.stderr_tail) or ["exit status " + str(code)])[0]

    def finish(self, state: str, code: int | None, error: str | None) -> None:
        self.store.update(self.job.id, state=state, ended=time.time(), exit_code=code, error=error)
        self.store.release_gpu(self.job.id)
        self.log.write({"event": state, "exit_code": code, "error": error})


def _physical_gpu(slot: int) -> str:
    """The device the slot means to CUDA: an entry of the inherited `CUDA_VISIBLE_DEVICES`."""
    visible = [v.strip() for v in os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",")]
    visible = [v for v in visible if v]
    return visible[slot] if slot < len(visible) else str(slot)


def main(argv: list[str] | None = None) -> int:
    job_id = int((sys.argv[1:] if argv is None else argv)[0])
    store = JobStore()
    job = store.get(job_id)
    log = EventLog(Path(job.folder))
    try:
        Supervisor(store, job, log).run()
    except BaseException as e:  # a bug here must still end the job visibly
        store.update(job_id, state=FAILED, ended=time.time(), error=f"supervisor failed: {e!r}")
        store.release_gpu(job_id)
        raise
    finally:
        log.close()
        store.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())

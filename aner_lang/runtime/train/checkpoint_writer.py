"""Checkpoints written while training goes on: the loop hands over a snapshot (host copies it no
longer touches) and a thread writes, verifies and publishes it (`checkpoint.save`).

Rules:

* At most `PENDING` checkpoints are handed over and not yet published: one being written and one
  waiting for it, so at most two snapshots wait in host memory. Each write starts after the
  previous one has ended: checkpoints are published in order.
* A checkpoint handed over while another still waits for the disk (a write slower than the
  interval between checkpoints: a disk still flushing a model written just before the run)
  replaces the waiting one, which is never written, instead of holding the loop: a run keeps only
  its latest checkpoint, so the replaced one would have been removed once the newer one was
  published, and the newer one reaches the disk no later. `submit` says which it replaced.
  Only a checkpoint that takes over each role of the waiting one replaces it: the run's latest
  by a latest, its best by a best (a best-only checkpoint, at a validation between checkpoint
  updates, does not move the latest one). Otherwise the loop waits for the oldest write.
* A failed write is raised in the training thread, as an Aner error naming the directory, when
  a later checkpoint waits for it, at the next update's `poll` or when the writer is closed: no
  checkpoint is silently lost.
* `close()` at the end of a run, and `abandon()` when it fails or is interrupted, wait for the
  writes in flight, so every thread is joined before `train` returns and a checkpoint reported written is
  on disk. The thread is not a daemon: a process that exits while it writes finishes the write
  first. A process killed mid-write leaves the previous checkpoint as the latest one
  (`checkpoint` publishes a folder only once it is complete).
* `best`, when given, is published after the checkpoint as a second name for the same files
  (`checkpoint.publish_copy`), never a second copy.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from aner_lang.problems.errors import AnerRuntimeError
from aner_lang.runtime.train import checkpoint
from aner_lang.runtime.train.state import TrainState


@dataclass(frozen=True)
class Written:
    """A checkpoint the writer published: its folder, the update it holds, and whether it is
    the run's latest checkpoint (not only its best one)."""

    folder: Path
    updates: int
    latest: bool


@dataclass(frozen=True)
class Submitted:
    """What handing a checkpoint over cost: the seconds the loop waited for earlier writes, and
    the update of the waiting checkpoint it replaced (None if none)."""

    waited: float
    replaced: int | None


PENDING = 2
"""Checkpoints handed over and not yet published, at most (see the module docstring)."""
DROP_POLL_SECONDS = 0.05
"""How often a write waiting for the previous one looks whether it was given up (so that its
thread ends soon after, not when the disk is free)."""


class _Write(threading.Thread):
    """One handed-over checkpoint, written after `before` has ended; `outcome` once it has."""

    def __init__(
        self,
        before: threading.Thread | None,
        directory: str | Path | None,
        state: TrainState,
        best: Path | None,
    ) -> None:
        super().__init__(name="aner-checkpoint")
        self.before, self.directory, self.best = before, directory, best
        self.state: TrainState | None = state
        self.updates = state.updates
        self.outcome: Written | BaseException | None = None
        self._lock = threading.Lock()
        self._begun = self._dropped = False

    def drop(self) -> bool:
        """Give this write up unless it has begun; whether it was given up."""
        with self._lock:
            self._dropped = not self._begun
            return self._dropped

    def run(self) -> None:
        while self.before is not None and self.before.is_alive() and not self._dropped:
            self.before.join(DROP_POLL_SECONDS)
        with self._lock:
            self._begun = not self._dropped
        directory, state, best = self.directory, self.state, self.best
        # no chain of ended writes, each holding its snapshot, stays reachable from this one
        self.before, self.state = None, None
        if not self._begun:
            return
        assert state is not None  # a write runs once
        where = directory if directory is not None else best
        try:
            if directory is not None:
                folder = checkpoint.save(directory, state)
                if best is not None:
                    checkpoint.publish_copy(best, folder)
            else:
                assert best is not None
                folder = checkpoint.save(best, state, keep=0)
            self.outcome = Written(folder, state.updates, latest=directory is not None)
        except OSError as e:
            self.outcome = AnerRuntimeError(
                f"checkpoint {where}: cannot be written: {e.strerror or e}",
                code="E-IO",
                notes=("the previous checkpoint, if any, is still the latest one",),
            )
        except BaseException as e:  # raised again in the training thread by `_finish`
            self.outcome = e


class CheckpointWriter:
    """One `train` call's background checkpoint writes (see the module docstring)."""

    def __init__(self, on_written: Callable[[Written], None]) -> None:
        self._on_written = on_written
        """Called in the training thread for every published checkpoint, in order."""
        self._pending: deque[_Write] = deque()
        self._replaced: list[_Write] = []
        """Writes given up for newer ones: their threads end within `DROP_POLL_SECONDS`."""
        self.last: Written | None = None
        """The run's latest checkpoint known to be published."""

    def submit(
        self, directory: str | Path | None, state: TrainState, best: Path | None
    ) -> Submitted:
        """Write `state` as the latest checkpoint of `directory` (when given) and publish it as
        `best` too (when given) in the background, after the previous write has ended; says
        which waiting checkpoint it replaced and how long it waited for earlier writes (see the
        module docstring)."""
        replaced = None
        if len(self._pending) >= PENDING:
            waiting = self._pending[-1]
            covers = (waiting.directory is None or directory is not None) and (
                waiting.best is None or best is not None
            )
            if covers and waiting.drop():
                self._replaced.append(self._pending.pop())
                replaced = waiting.updates
        waited = 0.0
        while len(self._pending) >= PENDING:
            began = time.perf_counter()
            self._finish()
            waited += time.perf_counter() - began
        write = _Write(self._pending[-1] if self._pending else None, directory, state, best)
        self._pending.append(write)
        write.start()
        return Submitted(waited, replaced)

    def _finish(self) -> None:
        """Wait for the oldest write in flight; report what it wrote, or raise what it raised."""
        write = self._pending.popleft()
        write.join()
        if isinstance(write.outcome, BaseException):
            raise write.outcome
        if write.outcome is not None:
            if write.outcome.latest:
                self.last = write.outcome
            self._on_written(write.outcome)

    def wait(self) -> None:
        """Wait for every write in flight, reporting each in order (see `_finish`)."""
        while self._pending:
            self._finish()
        self._join_replaced()

    def _join_replaced(self) -> None:
        while self._replaced:
            self._replaced.pop().join()

    def poll(self) -> None:
        """Report the writes that have ended (see `_finish`), without waiting for one in flight:
        called every update, so a job's supervisor learns of a checkpoint while the run goes on,
        not only at the next one (a run killed in between resumes from it)."""
        while self._pending and not self._pending[0].is_alive():
            self._finish()

    def close(self) -> None:
        """Wait for the writes in flight (see `wait`)."""
        self.wait()

    def abandon(self) -> None:
        """Wait for the writes in flight without reporting them: the run is failing already,
        and its own error is the one to show. A no-op after `close`."""
        while self._pending:
            self._pending.popleft().join()
        self._join_replaced()

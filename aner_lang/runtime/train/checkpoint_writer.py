"""Checkpoints written while training goes on: the loop hands over a snapshot (host copies it no
longer touches) and a thread writes, verifies and publishes it (`checkpoint.save`).

Rules:

* At most one write is in flight: handing over the next checkpoint first waits for the previous
  one, so checkpoints are published in order and at most one snapshot waits in host memory
  besides the one being written.
* A failed write is raised in the training thread, as an Aner error naming the directory, when
  the next checkpoint is handed over or when the writer is closed: no checkpoint is silently lost.
* `close()` at the end of a run, and `abandon()` when it fails or is interrupted, wait for the
  write in flight, so every thread is joined before `train` returns and a checkpoint reported written is
  on disk. The thread is not a daemon: a process that exits while it writes finishes the write
  first. A process killed mid-write leaves the previous checkpoint as the latest one
  (`checkpoint` publishes a folder only once it is complete).
* `best`, when given, is published after the checkpoint as a second name for the same files
  (`checkpoint.publish_copy`), never a second copy.
"""

from __future__ import annotations

import threading
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


class CheckpointWriter:
    """One `train` call's background checkpoint writes (see the module docstring)."""

    def __init__(self, on_written: Callable[[Written], None]) -> None:
        self._on_written = on_written
        """Called in the training thread for every published checkpoint, in order."""
        self._thread: threading.Thread | None = None
        self._outcome: Written | BaseException | None = None
        self.last: Written | None = None
        """The run's latest checkpoint known to be published."""

    def submit(self, directory: str | Path | None, state: TrainState, best: Path | None) -> None:
        """Write `state` as the latest checkpoint of `directory` (when given) and publish it as
        `best` too (when given) in the background, after the previous write has finished."""
        self.wait()
        thread = threading.Thread(
            target=self._write, args=(directory, state, best), name="aner-checkpoint"
        )
        self._thread = thread
        thread.start()

    def _write(self, directory: str | Path | None, state: TrainState, best: Path | None) -> None:
        where = directory if directory is not None else best
        try:
            if directory is not None:
                folder = checkpoint.save(directory, state)
                if best is not None:
                    checkpoint.publish_copy(best, folder)
            else:
                assert best is not None
                folder = checkpoint.save(best, state, keep=0)
            self._outcome = Written(folder, state.updates, latest=directory is not None)
        except OSError as e:
            self._outcome = AnerRuntimeError(
                f"checkpoint {where}: cannot be written: {e.strerror or e}",
                code="E-IO",
                notes=("the previous checkpoint, if any, is still the latest one",),
            )
        except BaseException as e:  # raised again in the training thread by `wait`
            self._outcome = e

    def wait(self) -> None:
        """Wait for the write in flight; report what it wrote, or raise what it raised."""
        if self._thread is None:
            return
        self._thread.join()
        self._thread = None
        outcome, self._outcome = self._outcome, None
        if isinstance(outcome, BaseException):
            raise outcome
        if outcome is not None:
            if outcome.latest:
                self.last = outcome
            self._on_written(outcome)

    def poll(self) -> None:
        """Report a write that has finished (see `wait`), without waiting for one in flight:
        called every update, so a job's supervisor learns of a checkpoint while the run goes on,
        not only at the next one (a run killed in between resumes from it)."""
        if self._thread is not None and not self._thread.is_alive():
            self.wait()

    def close(self) -> None:
        """Wait for the write in flight (see `wait`)."""
        self.wait()

    def abandon(self) -> None:
        """Wait for the write in flight without reporting it: the run is failing already, and
        its own error is the one to show. A no-op after `close`."""
        if self._thread is not None:
            self._thread.join()
            self._thread, self._outcome = None, None

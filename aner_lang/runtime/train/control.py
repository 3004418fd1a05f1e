"""Run control: stop requests, and what a background job asks of every `train` call.

The trainer calls `begin(...)` once per `train` call and runs its loop inside the returned
`RunControl`:

* Stop requests. While a `train` call runs in the main thread, SIGTERM and SIGINT do not kill the
  process: they ask the loop to finish the update in progress, write a checkpoint (when the run
  has a checkpoint directory) and end the run by raising `RunStopped`, which the `aner` command
  reports in one line. A second SIGINT interrupts at once, as Ctrl-C usually does.
* Jobs. A script started by `aner submit` runs with `ANER_JOB_DIR` (the job's folder) in its
  environment; `aner_lang.runtime.jobs` sets the variables of `job_env` and this module only
  reads them, so the trainer never imports the job room above it. In a job every `train` call checkpoints: into
  the script's `checkpoints:` directory, or else into ``<job>/checkpoints/train-<k>`` for the k-th
  `train` call of the script, every `ANER_JOB_CHECKPOINT_EVERY` updates unless the script says.
  In a resumed job (`ANER_JOB_RESUME=1`) a `train` call whose adapter has not trained yet
  continues from the latest checkpoint of its directory, once the checkpoint is shown to come from
  the same call (adapter configuration, train options, profile, base model): the script runs again
  from its first line, and every `train` call picks up where it stopped, so the job ends exactly
  as an uninterrupted one. Every training event is also written, one JSON object a line, to the
  file descriptor `ANER_JOB_EVENTS_FD`, from which the job's supervisor records progress.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from types import FrameType
from typing import Any, TextIO

from aner_lang.problems.errors import AnerRuntimeError, RunStopped
from aner_lang.runtime.io.world import world
from aner_lang.runtime.train import checkpoint
from aner_lang.runtime.train.job_env import (
    JOB_CHECKPOINT_EVERY,
    JOB_DIR,
    JOB_EVENTS_FD,
    JOB_RESUME,
)
from aner_lang.runtime.train.profile import Profile
from aner_lang.runtime.train.state import TrainState

_STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)
_train_calls = 0
"""`train` calls begun in this process: the k of a job's ``train-<k>`` checkpoint directory."""
_event_stream: TextIO | None = None


@dataclass
class RunControl:
    """One `train` call's checkpoint settings (the job's defaults applied) and stop flag."""

    checkpoints: str | None
    checkpoint_every: int
    call: int
    in_job: bool = False
    stop_requested: bool = False
    stop_signal: int | None = None
    """The signal that asked the run to stop (SIGINT: Ctrl-C, SIGTERM: `aner cancel`)."""

    @contextmanager
    def stop_signals(self) -> Iterator[None]:
        """SIGTERM and SIGINT set `stop_requested` while the block runs (main thread only:
        Python delivers signals there); the previous handlers come back afterwards."""
        if threading.current_thread() is not threading.main_thread():
            yield
            return

        def on_signal(signum: int, _frame: FrameType | None) -> None:
            if self.stop_requested and signum == signal.SIGINT:
                raise KeyboardInterrupt
            self.stop_requested, self.stop_signal = True, signum
            if signum == signal.SIGINT:
                print(
                    "\ntrain: Ctrl-C: stopping after this update (press it again to stop at once)",
                    file=sys.stderr,
                    flush=True,
                )

        previous = {s: signal.getsignal(s) for s in _STOP_SIGNALS}
        for s in _STOP_SIGNALS:
            signal.signal(s, on_signal)
        try:
            yield
        finally:
            for s, handler in previous.items():
                signal.signal(s, handler if handler is not None else signal.SIG_DFL)

    def emit(self, event: dict[str, Any]) -> None:
        """Send a training event to the job's supervisor (nothing outside a job)."""
        stream = _events()
        if stream is None:
            return
        try:
            stream.write(json.dumps({**event, "train": self.call}, default=_number) + "\n")
            stream.flush()
        except OSError:  # the supervisor is gone: training goes on, its checkpoints still count
            pass

    def checkpointed(self, folder: Path, updates: int) -> None:
        """Tell the job's supervisor that the checkpoint of update `updates` is in `folder`."""
        self.emit({"event": "checkpoint", "update": updates, "path": str(folder)})

    def stopped(self, updates: int, steps: int, saved: Path | None) -> RunStopped:
        """The exception that ends a run stopped after update `updates`."""
        self.emit({"event": "stopped", "update": updates, "checkpoint": str(saved or "")})
        where = (
            f"; checkpoint written: {saved}"
            if saved is not None
            else "; no checkpoint was written (train without `checkpoints:`)"
        )
        return RunStopped(f"training stopped on request after update {updates} of {steps}{where}")


def _number(value: Any) -> float:
    """A value the event still holds on the device (the gradient norm), as a number."""
    return float(value)


def _events() -> TextIO | None:
    global _event_stream
    fd = os.environ.get(JOB_EVENTS_FD)
    if _event_stream is None and fd and world().main:  # one stream of events per run: rank 0's
        _event_stream = os.fdopen(int(fd), "w", encoding="utf-8", closefd=False)
    return _event_stream


def begin(
    adapter: Any,
    profile: Profile,
    options: dict[str, Any],
    checkpoints: str | None,
    checkpoint_every: int,
) -> RunControl:
    """The control of a `train` call about to start (see the module docstring); in a resumed
    job, the adapter is first brought to its latest checkpoint."""
    global _train_calls
    _train_calls += 1
    job = os.environ.get(JOB_DIR)
    if not job:
        return RunControl(checkpoints, checkpoint_every, _train_calls)
    directory = checkpoints or str(Path(job) / "checkpoints" / f"train-{_train_calls}")
    every = checkpoint_every or int(os.environ.get(JOB_CHECKPOINT_EVERY) or 0)
    control = RunControl(directory, every, _train_calls, in_job=True)
    resuming = os.environ.get(JOB_RESUME) == "1"
    if resuming and adapter.state is None and checkpoint.has_checkpoint(directory):
        _restore(adapter, profile, options, Path(directory))
    return control


def _same(recorded: Any, now: Any) -> bool:
    return json.dumps(recorded, sort_keys=True) == json.dumps(now, sort_keys=True)


def _restore(adapter: Any, profile: Profile, options: dict[str, Any], directory: Path) -> None:
    """Load the latest checkpoint under `directory` into the fresh `adapter`, in place (the
    script holds this very object), after checking that the same `train` call wrote it."""
    ck = checkpoint.load(directory, base_path=adapter.base.path, profile=profile.to_json())
    for what, recorded, now in (
        ("adapter", ck.meta.get("adapter"), adapter.config),
        ("train options", ck.meta.get("options"), options),
    ):
        if not _same(recorded, now):
            raise AnerRuntimeError(
                f"cannot resume the job: the checkpoint in {directory} was written with other "
                f"{what} than this `train` call has now",
                code="E-JOB-RESUME",
                notes=(
                    f"checkpoint: {json.dumps(recorded, sort_keys=True)}",
                    f"now:        {json.dumps(now, sort_keys=True)}",
                    "a job resumes the script it was submitted with; submit a changed script "
                    "as a new job",
                ),
            )
    state = TrainState.from_parts(ck.tensors, ck.meta)
    prefix = "adapter/"
    adapter.load_tensors(
        {k[len(prefix) :]: v for k, v in state.tensors.items() if k.startswith(prefix)}
    )
    adapter.state = state

"""SIGTERM stops an `aner run` as Ctrl-C does: job supervisors, `timeout` and CI send it to end a
run, so it must never be ignored or end the script without a word.

While `stopping_on_sigterm()` is active (around a whole script), SIGTERM raises `RunStopped` where
the script is, so no further statement runs and the `aner` command reports it in one line with
`EXIT_STOPPED`, as Ctrl-C raises `KeyboardInterrupt` at once. A `train` call installs its own
handler for its duration (`aner_lang.runtime.train.control`): there the update in progress
finishes and the checkpoint is written first, and the stop still ends the script.
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from types import FrameType

from aner_lang.problems.errors import RunStopped


def _stop(_signum: int, _frame: FrameType | None) -> None:
    raise RunStopped("run stopped on request (SIGTERM); the rest of the script did not run")


@contextmanager
def stopping_on_sigterm() -> Iterator[None]:
    """SIGTERM raises `RunStopped` while the block runs (the main thread only: Python delivers
    signals there and refuses handlers elsewhere); the previous handler comes back afterwards."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.signal(signal.SIGTERM, _stop)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous if previous is not None else signal.SIG_DFL)

"""A one-line progress bar over bytes (tensors loaded, bytes done, rate), on a terminal only.

Nothing is printed when the stream is not a terminal (a log file, a pipe, a test), so batch runs
and captured output stay clean. The line is redrawn at most every `interval` seconds.
"""

from __future__ import annotations

import sys
import time
from typing import TextIO


def _gb(n: float) -> str:
    return f"{n / 1e9:.2f} GB"


class Progress:
    """`update(nbytes)` after each item; `close()` ends the line."""

    def __init__(
        self,
        label: str,
        total_bytes: int,
        items: int,
        stream: TextIO | None = None,
        interval: float = 0.1,
    ) -> None:
        self.stream = sys.stderr if stream is None else stream
        self.enabled = bool(getattr(self.stream, "isatty", lambda: False)())
        self.label, self.total, self.items = label, max(total_bytes, 1), items
        self.done = self.count = 0
        self.start = self.last = time.monotonic()
        self.interval = interval

    def update(self, nbytes: int) -> None:
        self.done += nbytes
        self.count += 1
        now = time.monotonic()
        if self.enabled and (now - self.last >= self.interval or self.count == self.items):
            self.last = now
            self._draw(now)

    def _draw(self, now: float) -> None:
        rate = self.done / max(now - self.start, 1e-9)
        width = 24
        filled = int(width * self.done / self.total)
        bar = "#" * filled + "-" * (width - filled)
        self.stream.write(
            f"\r{self.label} [{bar}] {100 * self.done / self.total:3.0f}% "
            f"{_gb(self.done)}/{_gb(self.total)} {_gb(rate)}/s "
            f"tensor {self.count}/{self.items}"
        )
        self.stream.flush()

    def close(self) -> None:
        if self.enabled:
            self._draw(time.monotonic())
            self.stream.write("\n")
            self.stream.flush()
